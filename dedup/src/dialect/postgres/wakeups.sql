-- PostgreSQL: the sending side of wake-ups (LISTEN/NOTIFY). The channels' names are
-- `postgres::CHANNEL` and `postgres::CANCEL_CHANNEL` (a unit test holds them equal).

-- name: notify
-- Wakes the workers that LISTEN on `task_dedup_wakeup` (sent at most once per debounce
-- interval; see `executor::notify`).
SELECT pg_notify('task_dedup_wakeup', '');

-- name: notify_cancel
-- Tells the listening workers that a task that may be running was cancelled: each looks
-- up its running tasks (not debounced: cancels are rare, and a swallowed one would wait
-- for the next heartbeat).
SELECT pg_notify('task_dedup_cancel', '');

-- name: probe
-- A worker's check that its listener's connection is a session of its own, from the
-- worker's pool: notifies $2 on the listener's own probe channel $1 if the listener's
-- server process ($3) has been idle for a while, as a session waiting for notifications
-- is. Behind a transaction pooler that process serves other clients too: busy (this very
-- statement, when the pooler lends it here) or busy a moment ago, it is not notified, and
-- so no other client of the pooler, which could borrow it at any moment, receives a
-- notification it did not ask for (its driver would fail on it). Idle long enough, the
-- pooler drops the notification, and the listener does not hear it. Rows the role may not
-- see have no state: notified then.
SELECT pg_notify($1, $2)
FROM pg_stat_activity
WHERE pid = $3
    AND (
        state = 'idle' AND state_change < clock_timestamp() - interval '100 milliseconds'
        OR state IS NULL
    );
