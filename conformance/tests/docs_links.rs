//! Every relative link in the workspace's README.md and in docs/*.md resolves: the file (or folder) it
//! names exists, relative to the linking file, and a `#anchor` names a heading of the target file by
//! its GitHub slug. Links to http(s) and mailto are not followed. Every page of docs/ is linked from
//! the README, which is the map of the documentation.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the conformance crate sits in the workspace")
        .to_path_buf()
}

/// README.md and every docs/*.md, sorted.
fn documentation_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    files
}

/// The text outside fenced code blocks (``` or ~~~), lines kept in place (a fenced line becomes
/// empty) so that line numbers stay right.
fn outside_fences(markdown: &str) -> Vec<&str> {
    let mut fence: Option<&str> = None;
    markdown
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            match fence {
                Some(marker) => {
                    if trimmed.starts_with(marker) {
                        fence = None;
                    }
                    ""
                }
                None => {
                    if trimmed.starts_with("```") {
                        fence = Some("```");
                        ""
                    } else if trimmed.starts_with("~~~") {
                        fence = Some("~~~");
                        ""
                    } else {
                        line
                    }
                }
            }
        })
        .collect()
}

/// `text` with the content of every inline code span (`` `…` ``, any run length, possibly across
/// lines of one paragraph) replaced by `x`s, so that brackets in code are not read as links.
/// Newlines are kept.
fn blank_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        // Find the closing run of exactly `run` backticks, within the paragraph.
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '\n' && chars.get(j + 1) == Some(&'\n') {
                break;
            }
            if chars[j] == '`' {
                let other = chars[j..].iter().take_while(|&&c| c == '`').count();
                if other == run {
                    close = Some(j);
                    break;
                }
                j += other;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                out.extend(std::iter::repeat_n('`', run));
                for &c in &chars[i + run..end] {
                    out.push(if c == '\n' { '\n' } else { 'x' });
                }
                out.extend(std::iter::repeat_n('`', run));
                i = end + run;
            }
            None => {
                out.extend(std::iter::repeat_n('`', run));
                i += run;
            }
        }
    }
    out
}

/// A link found in a file: its line (1-based) and its target as written.
#[derive(Debug, PartialEq)]
struct Link {
    line: usize,
    target: String,
}

/// The inline links `[text](target)` and images `![alt](target)` of a markdown file, outside code.
fn links(markdown: &str) -> Vec<Link> {
    let text = blank_code_spans(&outside_fences(markdown).join("\n"));
    let chars: Vec<char> = text.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i + 1 < chars.len() {
        if chars[i] == ']' && chars[i + 1] == '(' && closes_bracket(&chars[..i]) {
            // The target runs to the matching `)`, parentheses nested.
            let start = i + 2;
            let mut depth = 1;
            let mut j = start;
            while j < chars.len() && chars[j] != '\n' {
                match chars[j] {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            if depth == 0 {
                let raw: String = chars[start..j].iter().collect();
                let line = chars[..i].iter().filter(|&&c| c == '\n').count() + 1;
                found.push(Link {
                    line,
                    target: clean_target(&raw),
                });
                i = j + 1;
                continue;
            }
        }
        i += 1;
    }
    found
}

/// Whether the `]` after `before` closes a `[` (brackets nested) within the same paragraph.
fn closes_bracket(before: &[char]) -> bool {
    let mut depth = 0;
    for (k, &c) in before.iter().enumerate().rev() {
        match c {
            ']' => depth += 1,
            '[' if depth == 0 => return true,
            '[' => depth -= 1,
            '\n' if k > 0 && before[k - 1] == '\n' => return false,
            _ => {}
        }
    }
    false
}

/// The target without its optional title (`(path "title")`) and angle brackets (`(<path>)`).
fn clean_target(raw: &str) -> String {
    let raw = raw.trim();
    if let Some(inner) = raw.strip_prefix('<') {
        return inner.split('>').next().unwrap_or("").to_string();
    }
    raw.split_whitespace().next().unwrap_or("").to_string()
}

/// GitHub's anchor for a heading: lower-cased, every character that is not a letter, digit, space,
/// `-` or `_` removed, each space turned into `-`.
fn github_slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The text a heading shows: links reduced to their text, emphasis and code marks dropped.
fn heading_text(raw: &str) -> String {
    let mut text = String::new();
    let chars: Vec<char> = raw.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        // `](target)` ends a link: keep the text, skip the target.
        if chars[i] == ']'
            && chars.get(i + 1) == Some(&'(')
            && let Some(end) = chars[i..].iter().position(|&c| c == ')')
        {
            i += end + 1;
            continue;
        }
        if !matches!(chars[i], '[' | ']' | '`' | '*') {
            text.push(chars[i]);
        }
        i += 1;
    }
    // A closing sequence of `#`s is not part of the heading.
    text.trim().trim_end_matches('#').trim().to_string()
}

/// The anchors of a markdown file's ATX headings, with GitHub's `-1`, `-2` … for repeated slugs.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in outside_fences(markdown) {
        let trimmed = line.trim_start();
        if line.len() - trimmed.len() > 3 {
            continue;
        }
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) {
            continue;
        }
        let rest = &trimmed[hashes..];
        if !(rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')) {
            continue;
        }
        let slug = github_slug(&heading_text(rest));
        let mut anchor = slug.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{slug}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

fn is_external(target: &str) -> bool {
    let lower = target.to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://") || lower.starts_with("mailto:")
}

/// What is wrong with one link of `file`, if anything.
fn check_link(file: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("empty target".into());
    }
    let (path_part, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let resolved = if path_part.is_empty() {
        file.to_path_buf()
    } else if path_part.starts_with('/') {
        return Some("an absolute path: write it relative to the linking file".into());
    } else {
        file.parent().expect("a file has a folder").join(path_part)
    };
    if !resolved.exists() {
        return Some(format!("{} does not exist", resolved.display()));
    }
    let anchor = anchor?;
    if resolved.is_dir() {
        return Some(format!("#{anchor} on a folder ({})", resolved.display()));
    }
    let text = std::fs::read_to_string(&resolved)
        .unwrap_or_else(|err| panic!("reading {}: {err}", resolved.display()));
    let known = anchors(&text);
    if known.contains(anchor) {
        None
    } else {
        Some(format!(
            "{} has no heading with the anchor #{anchor} (its anchors: {})",
            resolved.display(),
            known
                .iter()
                .map(|a| format!("#{a}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let root = workspace_root();
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in documentation_files(&root) {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|err| panic!("reading {}: {err}", file.display()));
        for link in links(&text) {
            if is_external(&link.target) {
                continue;
            }
            checked += 1;
            if let Some(problem) = check_link(&file, &link.target) {
                let shown = file
                    .strip_prefix(&root)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                problems.push(format!(
                    "{shown}:{}: ({}) {problem}",
                    link.line, link.target
                ));
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} relative links found: is the link reader broken?"
    );
    assert!(
        problems.is_empty(),
        "{} broken link(s) in README.md and docs/:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_readme_links_every_page_of_docs() {
    let root = workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let linked: BTreeSet<String> = links(&readme)
        .into_iter()
        .map(|link| link.target.split('#').next().unwrap_or("").to_string())
        .collect();
    let unlinked: Vec<String> = documentation_files(&root)
        .into_iter()
        .skip(1)
        .map(|page| {
            page.strip_prefix(&root)
                .expect("under the root")
                .display()
                .to_string()
        })
        .filter(|page| !linked.contains(page))
        .collect();
    assert!(
        unlinked.is_empty(),
        "docs pages the README does not link: {unlinked:?}"
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(
        github_slug("What the suite checks"),
        "what-the-suite-checks"
    );
    assert_eq!(
        github_slug("Blind mistakes: the catch rate that counts"),
        "blind-mistakes-the-catch-rate-that-counts"
    );
    assert_eq!(
        github_slug("Settled is settled (D-10)"),
        "settled-is-settled-d-10"
    );
    assert_eq!(
        github_slug("Offline, on hosts without a registry or with cgroup v1"),
        "offline-on-hosts-without-a-registry-or-with-cgroup-v1"
    );
    assert_eq!(github_slug("snake_case and `code`"), "snake_case-and-code");
    assert_eq!(
        heading_text(" The [`conformance`](x.md) binary ##"),
        "The conformance binary"
    );
    let repeated = anchors("# A\n## A\n```\n# not a heading\n```\n### A\n#not-a-heading\n");
    assert_eq!(
        repeated,
        ["a", "a-1", "a-2"].into_iter().map(String::from).collect()
    );
}

#[test]
fn links_are_read_outside_code_only() {
    let text = "See [a](a.md) and [`b`](b.md#x \"title\").\n\n```\n[c](c.md)\n```\n\
                `[d](d.md)` and `` x `[e](e.md)` `` and [f [g]](<f g.md>)\n![img](i.png)\n";
    let targets: Vec<String> = links(text).into_iter().map(|l| l.target).collect();
    assert_eq!(targets, ["a.md", "b.md#x", "f g.md", "i.png"]);
    assert_eq!(links(text)[2].line, 6);
}
