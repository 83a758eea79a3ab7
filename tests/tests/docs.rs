//! The guide (`docs/`) and the root README hold together: every chapter file is in the book's
//! table of contents and every entry there exists, every relative link and `{{#include}}` points
//! at a file that exists, and every `#anchor` names a heading of its target. (Its Rust examples
//! run as doctests of `lock-tests`; CI also builds the book with mdbook.)

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code"
)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chapters(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read docs/src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            chapters(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// The Markdown links `[text](target)` of `text`, outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let mut in_code = false;
        let bytes = line.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'`' => in_code = !in_code,
                b']' if !in_code && bytes.get(i + 1) == Some(&b'(') => {
                    if let Some(end) = line[i + 2..].find(')') {
                        found.push(line[i + 2..i + 2 + end].to_owned());
                        i += 2 + end;
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
    found
}

/// The anchors of `text`'s headings, as mdBook and GitHub make them.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_fence = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        }
        if in_fence || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        out.insert(slug);
    }
    out
}

/// Checks every relative link and include of the Markdown file `file`; returns the problems.
fn check_file(file: &Path) -> Vec<String> {
    let text = fs::read_to_string(file).expect("read a Markdown file");
    let dir = file.parent().expect("a file's folder");
    let mut problems = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.trim().strip_prefix("{{#include ") {
            let target = rest.trim_end_matches("}}").trim();
            if !dir.join(target).is_file() {
                problems.push(format!(
                    "{}: include {target} does not exist",
                    file.display()
                ));
            }
        }
    }
    for link in links(&text) {
        if link.contains("://") || link.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
        let target = if path.is_empty() {
            file.to_path_buf()
        } else {
            dir.join(path)
        };
        if !target.exists() {
            problems.push(format!("{}: link {link} points nowhere", file.display()));
            continue;
        }
        if !anchor.is_empty() && target.extension().is_some_and(|e| e == "md") {
            let target_text = fs::read_to_string(&target).expect("read a link's target");
            if !anchors(&target_text).contains(anchor) {
                problems.push(format!(
                    "{}: link {link}: no heading #{anchor}",
                    file.display()
                ));
            }
        }
    }
    problems
}

#[test]
fn every_link_of_the_guide_and_the_readme_resolves() {
    let mut files = vec![root().join("README.md")];
    chapters(&root().join("docs/src"), &mut files);
    let problems: Vec<String> = files.iter().flat_map(|f| check_file(f)).collect();
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_table_of_contents_lists_every_chapter_and_only_chapters_that_exist() {
    let src = root().join("docs/src");
    let summary = fs::read_to_string(src.join("SUMMARY.md")).expect("docs/src/SUMMARY.md");
    let listed: BTreeSet<PathBuf> = links(&summary).iter().map(|l| src.join(l)).collect();
    let mut files = Vec::new();
    chapters(&src, &mut files);
    let files: BTreeSet<PathBuf> = files
        .into_iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "SUMMARY.md"))
        .collect();
    let missing: Vec<_> = files.difference(&listed).collect();
    let absent: Vec<_> = listed.difference(&files).collect();
    assert!(
        missing.is_empty(),
        "chapters not in SUMMARY.md: {missing:?}"
    );
    assert!(
        absent.is_empty(),
        "SUMMARY.md entries without a file: {absent:?}"
    );
}

#[test]
fn the_checker_finds_a_broken_link_and_a_missing_anchor() {
    let dir = std::env::temp_dir().join(format!("lock-docs-check-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let file = dir.join("page.md");
    fs::write(
        &file,
        "# A page\n\n## Real heading\n\n[ok](#real-heading) [gone](nowhere.md) [bad](#no-such)\n\
         `[code](span.md)`\n```text\n[fenced](x.md)\n```\n{{#include missing.md}}\n",
    )
    .unwrap();
    let problems = check_file(&file);
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].contains("include missing.md"));
    assert!(problems[1].contains("nowhere.md"));
    assert!(problems[2].contains("#no-such"));
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines: move detail to the guide"
    );
    for must in [
        "cargo run --release -p lock-examples --bin flash-sale",
        "bash scripts/test.sh",
        "## Choosing a backend",
        "BENCHMARKS.md",
        "FAULTS.md",
    ] {
        assert!(readme.contains(must), "README.md lacks {must:?}");
    }
}
