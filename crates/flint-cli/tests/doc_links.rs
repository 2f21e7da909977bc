//! The documentation stays inside the repository: every Markdown link in README.md, ARCHITECTURE.md,
//! docs/*.md, bench/README.md and web/README.md resolves to a file or folder of the repository
//! (none to the web or to ../shared), and README.md stays a short front page naming the test command.

use std::fs;
use std::path::{Path, PathBuf};

/// The repository root, canonical (this crate is crates/flint-cli).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository root")
}

/// The Markdown files whose links are checked.
fn doc_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["README.md", "ARCHITECTURE.md", "bench/README.md", "web/README.md"].iter().map(|f| root.join(f)).collect();
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("docs/ is readable")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// Every link target `](target)` outside fenced code blocks, with its line number; a title after
/// the target (`](file.md "title")`) is dropped.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push((i + 1, target.to_string()));
            rest = &after[end + 1..];
        }
    }
    out
}

#[test]
fn links_skip_fenced_code_and_titles() {
    let text = "a [x](one.md) b [y](two.md#z \"t\")\n```sh\n[no](three.md)\n```\n![z](four.png)\n";
    let got: Vec<String> = links(text).into_iter().map(|(_, t)| t).collect();
    assert_eq!(got, ["one.md", "two.md#z", "four.png"]);
}

#[test]
fn every_link_resolves_inside_the_repository() {
    let root = root();
    let mut bad = Vec::new();
    for file in doc_files(&root) {
        let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let dir = file.parent().expect("a file has a folder");
        for (line, target) in links(&text) {
            let at = format!("{}:{line}: ({target})", file.strip_prefix(&root).unwrap_or(file.as_path()).display());
            // A fragment names a heading; the file it is in must exist ("#x" alone is this file).
            let path = target.split('#').next().unwrap_or("");
            if target.contains("://") || target.starts_with("mailto:") || target.contains("../shared") {
                bad.push(format!("{at} points outside the repository"));
            } else if !path.is_empty() {
                match dir.join(path).canonicalize() {
                    Ok(resolved) if resolved.starts_with(&root) => {}
                    Ok(resolved) => bad.push(format!("{at} leaves the repository ({})", resolved.display())),
                    Err(e) => bad.push(format!("{at} does not resolve: {e}")),
                }
            }
        }
    }
    assert!(bad.is_empty(), "links that do not resolve inside the repository:\n{}", bad.join("\n"));
}

#[test]
fn readme_is_a_short_front_page() {
    let readme = fs::read_to_string(root().join("README.md")).expect("README.md");
    let limit = 12 * 1024;
    assert!(readme.len() <= limit, "README.md is {} bytes, over {limit}: move reference material into docs/", readme.len());
    assert!(readme.contains("bash scripts/test.sh"), "README.md must give the test command, bash scripts/test.sh");
}
