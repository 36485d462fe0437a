//! The import rule of ARCHITECTURE.md ("Who may import whom"), checked on the library's
//! source: every `crate::`/`super::` path in `dedup/src` (in `use` items and in code) is
//! resolved to the folder it lands in, and each folder may reach only the folders below
//! it. A second rule: inside the crate, a name is taken from the module that owns it,
//! never through `lib.rs`'s re-exports (`crate::DedupError`).
//!
//! Parsed with `syn`, so comments and doc links (which may name any public path) are not
//! imports. Paths inside macro invocations are not seen; the code has none that import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The folders (and top-level files) of `dedup/src`, each with the layers right below
/// it, from the bottom up: a folder may import those and, transitively, all they may
/// import. A folder appears only after everything it names, so the rule has no cycle by
/// construction (checked below).
const LAYERS: &[(&str, &[&str])] = &[
    ("dialect", &[]),
    ("metrics", &[]),
    ("values", &["dialect"]),
    // Not the rest of `values`: the executor returns `Failure`, never `DedupError`.
    ("executor", &["dialect", "values::connection"]),
    ("connect", &["executor", "values", "metrics"]),
    ("enqueue", &["connect"]),
    ("maintenance", &["connect"]),
    ("lifecycle", &["maintenance"]),
    ("admin", &["lifecycle"]),
    ("worker", &["lifecycle", "enqueue"]),
    ("testing", &["worker"]),
    ("guide", &[]),
];

/// What `unit` may import: its layers below, and theirs.
fn reachable(unit: &str) -> Vec<String> {
    let layers: BTreeMap<&str, &[&str]> = LAYERS.iter().copied().collect();
    let mut out: Vec<String> = Vec::new();
    let mut todo: Vec<&str> = layers.get(unit).map(|l| l.to_vec()).unwrap_or_default();
    while let Some(next) = todo.pop() {
        if out.iter().any(|o| o == next) {
            continue;
        }
        out.push(next.to_owned());
        let head = next.split("::").next().unwrap_or(next);
        todo.extend(layers.get(head).map(|l| l.to_vec()).unwrap_or_default());
    }
    out
}

/// A path of the crate's module tree, `crate` left out: `["enqueue", "bulk"]`.
type ModPath = Vec<String>;

fn source_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("dedup/src")
}

/// Every `.rs` file under `dir`, with its module path.
fn files(dir: &Path, module: &ModPath, out: &mut Vec<(PathBuf, ModPath)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            let mut sub = module.clone();
            sub.push(name);
            files(&path, &sub, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let mut m = module.clone();
            if name != "mod" && !(module.is_empty() && name == "lib") {
                m.push(name);
            }
            out.push((path, m));
        }
    }
}

/// Collects the `crate::`/`super::`/`self::` paths of one file, resolved to absolute
/// module paths (`module`: where the visitor is, inline `mod` blocks included).
struct Refs {
    module: ModPath,
    found: Vec<ModPath>,
}

impl Refs {
    fn resolve(&mut self, segments: &[String]) {
        let Some(first) = segments.first() else {
            return;
        };
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "super" | "self" => self.module.clone(),
            _ => return,
        };
        let mut rest = &segments[1..];
        if first == "super" {
            base.pop();
        }
        while rest.first().is_some_and(|s| s == "super") {
            base.pop();
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        self.found.push(base);
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut full = prefix.clone();
                if n.ident != "self" {
                    full.push(n.ident.to_string());
                }
                self.resolve(&full);
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                if r.ident != "self" {
                    full.push(r.ident.to_string());
                }
                self.resolve(&full);
            }
            syn::UseTree::Glob(_) => {
                let full = prefix.clone();
                self.resolve(&full);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Refs {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.resolve(&segments);
        syn::visit::visit_path(self, path);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if item.content.is_some() {
            self.module.push(item.ident.to_string());
            syn::visit::visit_item_mod(self, item);
            self.module.pop();
        }
    }
}

/// Whether `target` (an absolute module path) lies in the unit named `allowed`
/// (`"values"` or `"values::connection"`).
fn within(target: &ModPath, allowed: &str) -> bool {
    let allowed: Vec<&str> = allowed.split("::").collect();
    target.len() >= allowed.len() && target.iter().zip(&allowed).all(|(a, b)| a == b)
}

/// Every reference that breaks a rule, as `module -> target: why`.
fn violations() -> Vec<String> {
    let root = source_root();
    let mut all = Vec::new();
    files(&root, &Vec::new(), &mut all);
    assert!(all.len() > 20, "dedup/src not found at {}", root.display());
    let top: BTreeSet<String> = all.iter().filter_map(|(_, m)| m.first().cloned()).collect();
    let mut out = Vec::new();
    for (path, module) in &all {
        let text = std::fs::read_to_string(path).unwrap();
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut refs = Refs {
            module: module.clone(),
            found: Vec::new(),
        };
        refs.visit_file(&file);
        let shown = path.strip_prefix(&root).unwrap().display().to_string();
        let Some(unit) = module.first() else {
            continue; // lib.rs declares the modules and re-exports the API
        };
        if !LAYERS.iter().any(|(u, _)| u == unit) {
            out.push(format!(
                "{shown}: `{unit}` is in no layer of tests/layers.rs"
            ));
            continue;
        }
        let allowed = reachable(unit);
        for target in refs.found {
            let Some(first) = target.first() else {
                continue;
            };
            if !top.contains(first) {
                // `crate::task_run`, `crate::DedupError`: a name re-exported by lib.rs.
                out.push(format!(
                    "{shown}: crate::{} is a re-export of lib.rs; import it from its owner",
                    target.join("::")
                ));
                continue;
            }
            if first == unit || allowed.iter().any(|a| within(&target, a)) {
                continue;
            }
            out.push(format!(
                "{shown}: `{unit}` may not import crate::{}",
                target.join("::")
            ));
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn folders_import_only_the_layers_below_them() {
    let found = violations();
    assert!(
        found.is_empty(),
        "imports against ARCHITECTURE.md's rule:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn every_layer_names_only_layers_listed_before_it() {
    for (i, (unit, allowed)) in LAYERS.iter().enumerate() {
        for a in *allowed {
            let head = a.split("::").next().unwrap();
            assert!(
                LAYERS[..i].iter().any(|(u, _)| *u == head),
                "`{unit}` may import `{a}`, which is not below it"
            );
        }
    }
}

/// The dialects' statements are text, not programs: every one is whole in a SQL file,
/// and the one render step (`dialect/render.rs`) fills its markers. A `macro_rules!` in
/// `dialect/` would be SQL composed again (issue 51).
#[test]
fn no_macro_composes_sql() {
    let root = source_root();
    let mut files = Vec::new();
    let dialect = ModPath::default();
    self::files(&root.join("dialect"), &dialect, &mut files);
    assert!(!files.is_empty(), "no files under dialect/");
    let macros: Vec<String> = files
        .iter()
        .filter(|(path, _)| {
            std::fs::read_to_string(path)
                .expect("read")
                .contains("macro_rules!")
        })
        .map(|(path, _)| path.display().to_string())
        .collect();
    assert!(macros.is_empty(), "macro_rules! in {macros:?}");
}
