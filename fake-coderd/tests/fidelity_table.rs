//! The fidelity table of README.md ("## Fidelity table") names, for every behaviour an operator can
//! observe, the coderd source it follows and the fake's test that pins it. This checks the table:
//! every row has a source and at least one test, and every named test exists, as a function in
//! `tests/*.rs` or `src/**/*.rs`, and, for `function::case`, as an rstest case of that function.

use std::path::{Path, PathBuf};

const HEADING: &str = "## Fidelity table";

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// The sources the named tests may live in, with their text.
fn sources() -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(&crate_dir().join("src"), &mut files);
    rust_files(&crate_dir().join("tests"), &mut files);
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            (path, text)
        })
        .collect()
}

/// The table's data rows, split into trimmed cells (the header and separator rows skipped).
fn table_rows(readme: &str) -> Vec<Vec<String>> {
    let start = readme
        .find(HEADING)
        .unwrap_or_else(|| panic!("README.md has no {HEADING:?} section"));
    let section = &readme[start + HEADING.len()..];
    let section = section.find("\n## ").map_or(section, |end| &section[..end]);
    section
        .lines()
        .filter(|line| line.starts_with('|'))
        .skip(2)
        .map(|line| {
            line.trim()
                .trim_matches('|')
                .split(" | ")
                .map(|cell| cell.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The backticked names of a "pinned by" cell.
fn test_names(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Where `fn name` is defined: the file and the text of its attributes (what lies between the end
/// of the previous item and the `fn`), or `None`.
fn find_fn<'s>(sources: &'s [(PathBuf, String)], name: &str) -> Option<(&'s Path, &'s str)> {
    sources.iter().find_map(|(path, text)| {
        let at = [format!("fn {name}("), format!("fn {name}<")]
            .iter()
            .find_map(|pattern| text.find(pattern.as_str()))?;
        let before = &text[..at];
        let item_start = before.rfind("\n}\n").map_or(0, |end| end + 3);
        Some((path.as_path(), &text[item_start..at]))
    })
}

fn problems_of(readme: &str, sources: &[(PathBuf, String)]) -> Vec<String> {
    let rows = table_rows(readme);
    let mut problems = Vec::new();
    if rows.len() < 20 {
        problems.push(format!("only {} rows in the fidelity table", rows.len()));
    }
    for row in &rows {
        let [case, answer, source, pinned] = row.as_slice() else {
            problems.push(format!("row without exactly 4 cells: {row:?}"));
            continue;
        };
        if case.is_empty() || answer.is_empty() || source.is_empty() {
            problems.push(format!("row with an empty cell: {row:?}"));
        }
        let names = test_names(pinned);
        if names.is_empty() {
            problems.push(format!("row {case:?} names no test"));
        }
        for name in names {
            let (function, rstest_case) = match name.split_once("::") {
                Some((function, rstest_case)) => (function, Some(rstest_case)),
                None => (name.as_str(), None),
            };
            match (find_fn(sources, function), rstest_case) {
                (None, _) => problems.push(format!("row {case:?}: no test function `{function}`")),
                (Some((path, attributes)), Some(rstest_case)) => {
                    let attribute = format!("#[case::{rstest_case}(");
                    if !attributes.contains(&attribute) {
                        problems.push(format!(
                            "row {case:?}: `{function}` in {} has no case `{rstest_case}`",
                            path.display()
                        ));
                    }
                }
                (Some(_), None) => {}
            }
        }
    }
    problems
}

#[test]
fn every_row_of_the_fidelity_table_names_a_test_that_exists() {
    let readme = std::fs::read_to_string(crate_dir().join("README.md")).expect("README.md");
    let problems = problems_of(&readme, &sources());
    assert!(problems.is_empty(), "fidelity table: {problems:#?}");
}

#[test]
fn the_check_catches_a_missing_test_or_case() {
    let sources = vec![(
        PathBuf::from("x.rs"),
        "#[rstest]\n#[case::one(1)]\nfn pinned(n: u8) {}\n\nfn other() {}\n".to_owned(),
    )];
    let rows: String = (0..20)
        .map(|i| format!("| r{i} | 200 | `src.go` | `pinned::one`, `other` |\n"))
        .collect();
    let good = format!("{HEADING}\n\n| a | b | c | d |\n|---|---|---|---|\n{rows}");
    assert_eq!(problems_of(&good, &sources), Vec::<String>::new());
    let bad = good.replacen("`pinned::one`", "`pinned::two`, `gone`", 1);
    let problems = problems_of(&bad, &sources);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].contains("no case `two`"), "{problems:#?}");
    assert!(
        problems[1].contains("no test function `gone`"),
        "{problems:#?}"
    );
}
