// The physical write cost per task of three peer PostgreSQL job queues, phase by phase
// (enqueue, claim, ending), each on a fresh database. Run through bench/cost/peers.sh, which
// documents the environment; this file is the workload, phase.sql the measurement.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';

const here = dirname(fileURLToPath(import.meta.url));
const N = Number(process.env.COST_TASKS || 10000);
const BATCH = 32;
const base = (process.env.COST_PG_URL || 'postgres://postgres@127.0.0.1:5432').replace(/\/+$/, '');
const peers = (process.env.COST_PEERS || 'loco,graphile,pgboss').split(',').map((s) => s.trim());
const version = (name) =>
  JSON.parse(readFileSync(join(here, 'node_modules', name, 'package.json'), 'utf8')).version;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const log = (...a) => console.error(new Date().toISOString().slice(11, 19), ...a);

async function freshDatabase(name) {
  const admin = new pg.Client({ connectionString: `${base}/postgres` });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const url = `${base}/${name}`;
  const ctl = new pg.Client({ connectionString: url });
  ctl.on('error', (e) => log(`${name} control connection: ${e.message}`));
  await ctl.connect();
  await ctl.query('CREATE EXTENSION IF NOT EXISTS pg_walinspect');
  return { url, ctl };
}

async function lsn(ctl) {
  return (await ctl.query('SELECT pg_current_wal_insert_lsn()::text AS l')).rows[0].l;
}

// phase.sql through psql, as written (its :'from' / :'to' are psql variables).
function phaseFigures(url, from, to) {
  const out = execFileSync(
    'psql',
    ['-X', '-q', '-A', '-F', '\t', '-P', 'footer=off', '-d', url,
      '-v', 'ON_ERROR_STOP=1', '-v', `from=${from}`, '-v', `to=${to}`, '-f', join(here, 'phase.sql')],
    { encoding: 'utf8' },
  ).trim().split('\n');
  const keys = out[0].split('\t');
  const vals = out[1].split('\t').map(Number);
  return Object.fromEntries(keys.map((k, i) => [k, vals[i]]));
}

async function measure(db, phase, fn) {
  const from = await lsn(db.ctl);
  const t0 = Date.now();
  const tasks = await fn();
  const ms = Date.now() - t0;
  const to = await lsn(db.ctl);
  // pg_get_wal_records_info (PG15) refuses an end past the flushed WAL, and records after a
  // phase's last commit (a claim's final prunes) stay unflushed while the cluster is idle: a
  // transaction with an xid commits after `to` (outside the window, before the next `from`),
  // and the WAL writer flushes past it within wal_writer_delay.
  await db.ctl.query('SELECT pg_current_xact_id()');
  for (let i = 0; ; i++) {
    const { rows } = await db.ctl.query('SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn AS ok', [to]);
    if (rows[0].ok) break;
    if (i > 200) throw new Error(`WAL not flushed up to ${to}`);
    await sleep(25);
  }
  const f = phaseFigures(db.url, from, to);
  const { rows: kinds } = await db.ctl.query(BREAKDOWN, [from, to]);
  log(`  ${phase}: ${tasks} tasks in ${ms} ms, ${from}..${to}`);
  return { phase, tasks, ms, from, to, ...f, kinds };
}

// Which relations the counted records touch (first block reference), by record kind: the
// explanation of phase.sql's totals, not a figure of its own.
const BREAKDOWN = `
  WITH w AS (SELECT * FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)),
  db AS (SELECT oid::text AS oid FROM pg_database WHERE datname = current_database()),
  mine AS (SELECT w.*, substring(w.block_ref FROM ' rel [0-9]+/' || db.oid || '/([0-9]+) ') AS node
             FROM w, db WHERE w.block_ref LIKE '% rel %/' || db.oid || '/%')
  SELECT coalesce(pg_filenode_relation(0, node::oid)::regclass::text, 'filenode ' || node) AS rel,
         resource_manager AS rmgr, record_type AS kind, count(*)::int AS n,
         sum(record_length - fpi_length)::bigint AS bytes
    FROM mine GROUP BY 1, 2, 3
  UNION ALL
  SELECT '(commit)', resource_manager, record_type, count(*)::int, sum(record_length)::bigint
    FROM w WHERE resource_manager = 'Transaction' AND xid IN (SELECT xid FROM mine) GROUP BY 2, 3
  ORDER BY 5 DESC`;

async function indexList(ctl, tableFilter) {
  const { rows } = await ctl.query(
    `SELECT n.nspname || '.' || t.relname AS tbl, i.relname AS idx,
            pg_relation_size(i.oid) AS bytes, pg_get_indexdef(i.oid) AS def
       FROM pg_index x
       JOIN pg_class i ON i.oid = x.indexrelid
       JOIN pg_class t ON t.oid = x.indrelid
       JOIN pg_namespace n ON n.oid = t.relnamespace
      WHERE ${tableFilter}
      ORDER BY 1, 2`,
  );
  const { rows: tables } = await ctl.query(
    `SELECT n.nspname || '.' || t.relname AS tbl, pg_relation_size(t.oid) AS bytes
       FROM pg_class t JOIN pg_namespace n ON n.oid = t.relnamespace
      WHERE t.relkind IN ('r', 'p') AND ${tableFilter} ORDER BY 1`,
  );
  return { indexes: rows, tables };
}

const chunks = (xs, n) => Array.from({ length: Math.ceil(xs.length / n) }, (_, i) => xs.slice(i * n, i * n + n));

// ---- Loco 1.2.0 PgQueue (loco-rs src/bgworker/pg.rs), its statements replayed one job each.
const B32 = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
function ulid() {
  // 48-bit millisecond time + 80 random bits, Crockford base32, 26 characters (ulid crate).
  let t = BigInt(Date.now());
  let r = BigInt('0x' + randomBytes(10).toString('hex'));
  let v = (t << 80n) | r;
  let s = '';
  for (let i = 0; i < 26; i++) { s = B32[Number(v & 31n)] + s; v >>= 5n; }
  return s;
}

async function loco() {
  const db = await freshDatabase('cost_loco');
  const c = new pg.Client({ connectionString: db.url });
  c.on('error', (e) => log(`cost_loco connection: ${e.message}`));
  await c.connect();
  // initialize_database (pg.rs ~237), JobStatus::Queued = 'queued'.
  await c.query(`
                CREATE TABLE pg_loco_queue (
                    id VARCHAR NOT NULL,
                    name VARCHAR NOT NULL,
                    task_data JSONB NOT NULL,
                    status VARCHAR NOT NULL DEFAULT 'queued',
                    run_at TIMESTAMPTZ NOT NULL,
                    interval BIGINT,
                    created_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
                    updated_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
                    tags JSONB,
                    priority INT NOT NULL DEFAULT 0
                );
                `);
  await db.ctl.query('CHECKPOINT');
  const phases = [];
  // enqueue (pg.rs ~285): one INSERT per perform_later, autocommit.
  phases.push(await measure(db, 'enqueue', async () => {
    for (let i = 0; i < N; i++) {
      await c.query({
        name: 'loco_enqueue',
        text: 'INSERT INTO pg_loco_queue (id, task_data, name, run_at, interval, tags, priority) VALUES ($1, $2, $3, $4, $5, $6, $7)',
        values: [ulid(), JSON.stringify({ n: i }), 'CostWorker', new Date(), null, null, 0],
      });
    }
    return N;
  }));
  const idx = await indexList(db.ctl, `t.relname = 'pg_loco_queue'`);
  // claim (pg.rs dequeue ~364): one transaction per job: SELECT ... FOR UPDATE SKIP LOCKED
  // LIMIT 1 of an untagged worker, then the UPDATE to 'processing', COMMIT. An empty poll
  // drops the transaction (rollback).
  const ids = [];
  phases.push(await measure(db, 'claim', async () => {
    for (;;) {
      await c.query('BEGIN');
      const { rows } = await c.query({
        name: 'loco_dequeue',
        text: 'SELECT id, name, task_data, status, run_at, interval, tags, priority FROM pg_loco_queue WHERE status = $1 AND run_at <= NOW() AND (tags IS NULL)  ORDER BY priority DESC, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED',
        values: ['queued'],
      });
      if (rows.length === 0) { await c.query('ROLLBACK'); break; }
      await c.query({
        name: 'loco_processing',
        text: 'UPDATE pg_loco_queue SET status = $1, updated_at = NOW() WHERE id = $2',
        values: ['processing', rows[0].id],
      });
      await c.query('COMMIT');
      ids.push(rows[0].id);
    }
    return ids.length;
  }));
  // ending (pg.rs complete_job ~438, no interval): one UPDATE per job, autocommit.
  phases.push(await measure(db, 'ending', async () => {
    for (const id of ids) {
      await c.query({
        name: 'loco_complete',
        text: 'UPDATE pg_loco_queue SET status = $1, updated_at = NOW() WHERE id = $2',
        values: ['completed', id],
      });
    }
    return ids.length;
  }));
  await c.end();
  await db.ctl.end();
  return { peer: 'loco', version: 'loco-rs 1.2.0 (pg_loco_queue, replayed)', phases, ...idx };
}

// ---- graphile-worker: its own add_job, and its worker's own batch get / complete functions.
async function graphile() {
  const db = await freshDatabase('cost_graphile');
  const gwDist = join(here, 'node_modules', 'graphile-worker', 'dist');
  const { getUtilsAndReleasersFromOptions } = await import(join(gwDist, 'lib.js'));
  const { batchGetJobs } = await import(join(gwDist, 'sql', 'getJobs.js'));
  const { batchCompleteJobs } = await import(join(gwDist, 'sql', 'completeJobs.js'));
  const { getTaskDetails } = await import(join(gwDist, 'taskIdentifiers.js'));
  // Runs the migrations (runMigrations' path); no worker is started, so nothing polls.
  const [opts, release] = await getUtilsAndReleasersFromOptions({
    connectionString: db.url,
    concurrency: 1,
    maxPoolSize: 1,
    preset: { worker: { localQueue: { size: BATCH }, completeJobBatchDelay: 0 } },
  });
  const { withPgClient, addJob } = opts;
  const tasks = { cost: async () => {} };
  const poolId = 'cost-bench-pool';
  await db.ctl.query('CHECKPOINT');
  const phases = [];
  phases.push(await measure(db, 'enqueue', async () => {
    for (let i = 0; i < N; i++) await addJob('cost', { n: i });
    return N;
  }));
  const idx = await indexList(db.ctl, `n.nspname = 'graphile_worker' AND t.relname = '_private_jobs'`);
  await getTaskDetails(opts, withPgClient, tasks); // task id lookup cached before the phase
  const jobs = [];
  phases.push(await measure(db, 'claim', async () => {
    for (;;) {
      // LocalQueue's fetch: batchGetJobs(..., flagsToSkip null, localQueue.size)
      const got = await batchGetJobs(opts, withPgClient, tasks, poolId, null, BATCH);
      if (got.length === 0) break;
      jobs.push(...got);
    }
    return jobs.length;
  }));
  phases.push(await measure(db, 'ending', async () => {
    // main.js completeJob with completeJobBatchDelay >= 0: batchCompleteJobs of a batch
    for (const batch of chunks(jobs, BATCH)) await batchCompleteJobs(opts, withPgClient, poolId, batch);
    return jobs.length;
  }));
  await release();
  await db.ctl.end();
  return { peer: 'graphile', version: `graphile-worker ${version('graphile-worker')}`, phases, ...idx };
}

// ---- pg-boss: send one per call, fetch batchSize 32, complete 32 ids per call.
async function pgboss() {
  const db = await freshDatabase('cost_pgboss');
  const { PgBoss } = await import('pg-boss');
  const quiet = { supervise: false, schedule: false, registerInstance: false, useListenNotify: false };
  // Install the schema and the queue with one instance, then measure with another that
  // neither migrates (so no background migration poller) nor supervises nor schedules.
  const setup = new PgBoss({ connectionString: db.url, ...quiet, migrate: true, max: 2 });
  setup.on('error', (e) => log('pg-boss setup error', e.message));
  await setup.start();
  await setup.createQueue('cost');
  await setup.stop({ graceful: true, wait: true });
  const boss = new PgBoss({ connectionString: db.url, ...quiet, migrate: false, max: 2 });
  boss.on('error', (e) => log('pg-boss error', e.message));
  await boss.start();
  await db.ctl.query('CHECKPOINT');
  const phases = [];
  phases.push(await measure(db, 'enqueue', async () => {
    for (let i = 0; i < N; i++) await boss.send('cost', { n: i });
    return N;
  }));
  const idx = await indexList(db.ctl, `n.nspname = 'pgboss' AND t.relname LIKE 'job%'`);
  const ids = [];
  phases.push(await measure(db, 'claim', async () => {
    for (;;) {
      const got = await boss.fetch('cost', { batchSize: BATCH });
      if (!got || got.length === 0) break;
      ids.push(...got.map((j) => j.id));
    }
    return ids.length;
  }));
  phases.push(await measure(db, 'ending', async () => {
    for (const batch of chunks(ids, BATCH)) await boss.complete('cost', batch);
    return ids.length;
  }));
  await boss.stop({ graceful: true, wait: true });
  await db.ctl.end();
  return { peer: 'pgboss', version: `pg-boss ${version('pg-boss')}`, phases, ...idx };
}

// ---- the table
const runners = { loco, graphile, pgboss };
const results = [];
for (const p of peers) {
  if (!runners[p]) throw new Error(`unknown peer ${p} (loco, graphile, pgboss)`);
  // A peer whose run fails (the server restarted under it: a shared cluster) runs again
  // from a fresh database; its figures come from one whole, unbroken run.
  for (let attempt = 1; ; attempt++) {
    log(`${p}: ${N} tasks${attempt > 1 ? `, attempt ${attempt}` : ''}`);
    try {
      results.push(await runners[p]());
      break;
    } catch (e) {
      log(`${p} failed: ${e.message}`);
      if (attempt >= 3) throw e;
      await sleep(5000);
    }
  }
}

const pad = (s, n) => String(s).padStart(n);
const fmt = (x) => (Math.abs(x) >= 100 ? x.toFixed(0) : Math.abs(x) >= 10 ? x.toFixed(1) : x.toFixed(2));
const cols = [
  ['WAL B/task no FPI', (f, n) => f.wal_bytes_no_fpi / n],
  ['of it commits', (f, n) => f.commit_bytes / n],
  ['FPI B/task', (f, n) => f.fpi_bytes / n],
  ['btree entries/task', (f, n) => f.btree_entries / n],
  ['other idx rec/task', (f, n) => f.other_index_records / n],
  ['heap rec/task', (f, n) => (f.heap_inserts + f.heap_updates + f.heap_hot_updates + f.heap_deletes + f.heap_locks + f.heap_other) / n],
  ['  ins', (f, n) => f.heap_inserts / n],
  ['  upd', (f, n) => f.heap_updates / n],
  ['  hot', (f, n) => f.heap_hot_updates / n],
  ['  del', (f, n) => f.heap_deletes / n],
  ['  lock', (f, n) => f.heap_locks / n],
  ['  other', (f, n) => f.heap_other / n],
  ['commits/task', (f, n) => f.commit_records / n],
  ['records/task', (f, n) => f.records / n],
  ['all-db WAL B/task', (f, n) => f.total_wal_bytes / n],
];
const lines = [];
const say = (s = '') => { lines.push(s); console.log(s); };
say(`# peer write cost per task: ${N} tasks, batches of ${BATCH} where the peer batches`);
say(`# ${new Date().toISOString()}; ${results.map((r) => r.version).join('; ')}`);
say(`# WAL from pg_walinspect (bench/cost/phase.sql): this database's records + its commit records`);
say();
const head = `${'peer'.padEnd(9)}${'phase'.padEnd(8)}` + cols.map(([h]) => pad(h, h.length + 2)).join('');
say(head);
for (const r of results) {
  const life = { phase: 'life' };
  for (const k of Object.keys(r.phases[0])) {
    if (typeof r.phases[0][k] === 'number') life[k] = r.phases.reduce((a, p) => a + p[k], 0);
  }
  for (const f of [...r.phases, life]) {
    say(`${r.peer.padEnd(9)}${f.phase.padEnd(8)}` + cols.map(([h, fn]) => pad(fmt(fn(f, N)), h.length + 2)).join(''));
  }
}
say();
for (const r of results) {
  say(`## ${r.peer} (${r.version}): phase timings ` +
    r.phases.map((p) => `${p.phase} ${p.tasks} tasks ${p.ms} ms`).join(', '));
  say(`   tables after enqueue: ` + r.tables.map((t) => `${t.tbl} ${(t.bytes / 1024).toFixed(0)} kB`).join(', '));
  if (r.indexes.length === 0) say('   indexes after enqueue: none');
  for (const i of r.indexes) say(`   ${pad((i.bytes / 1024).toFixed(0), 6)} kB  ${i.def}`);
}
say();
say('record kinds per task, by relation of the first block reference (bytes without FPI):');
for (const r of results) {
  for (const p of r.phases) {
    say(`${r.peer} ${p.phase}:`);
    for (const k of p.kinds) {
      say(`   ${pad(fmt(k.n / N), 6)} x ${(k.rmgr + ' ' + k.kind).padEnd(24)} ${pad(fmt(Number(k.bytes) / N), 7)} B  ${k.rel}`);
    }
  }
}
say();
say('raw phase rows (per run, not per task):');
for (const r of results) {
  for (const { kinds, ...p } of r.phases) say(`${r.peer}\t${JSON.stringify(p)}`);
}

// Connections of a failed attempt may still hold the event loop.
process.exit(0);
