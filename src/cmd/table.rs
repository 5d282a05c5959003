//! The tables operator commands print for people (`node list`, `tablet
//! list`, `ns list`, `cell list`, `token list`, `cell formats`, `scan`,
//! `status`), through comfy-table: columns as wide as their widest cell,
//! numbers right-aligned, a rule under the header, no trailing blanks. The
//! same bytes on a terminal and in a pipe (comfy-table's terminal probing
//! is off), so `grep` and `awk` see what a person sees. Scripts use
//! `--json`, whose output no table touches.

use comfy_table::{CellAlignment, LineStyle, Table, TableStyle};

/// No borders, a dashed rule under the header.
const STYLE: TableStyle = TableStyle::new().header_separator(LineStyle::none().fill('-'));

/// A table with `header`; the columns in `right` are right-aligned.
pub fn new(header: &[&str], right: &[usize]) -> Table {
    let mut t = Table::new();
    t.load_style(STYLE);
    t.set_header(header.iter().copied());
    for &c in right {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

/// Two columns, name and value, no header (`status`).
pub fn pairs() -> Table {
    let mut t = Table::new();
    t.load_style(TableStyle::new());
    t
}

/// The table as lines, each without trailing blanks (the header's rule as
/// long as the longest line), ending in a newline.
pub fn render(t: &Table) -> String {
    let is_rule = |l: &str| !l.is_empty() && l.chars().all(|c| c == '-');
    // The border column of the style is a blank: drop it too.
    let lines: Vec<String> = t
        .lines()
        .map(|l| l.strip_prefix(' ').unwrap_or(&l).trim_end().to_string())
        .collect();
    let width = lines
        .iter()
        .filter(|l| !is_rule(l))
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for line in &lines {
        if is_rule(line) {
            out.push_str(&"-".repeat(width));
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// Prints the table on stdout.
pub fn print(t: &Table) {
    print!("{}", render(t));
}

#[cfg(test)]
mod tests {
    #[test]
    fn aligned_ruled_and_trimmed() {
        let mut t = super::new(&["node", "state", "replicas"], &[0, 2]);
        t.add_row(vec!["1", "up", "12"]);
        t.add_row(vec!["10", "decommissioned", "0"]);
        let text = super::render(&t);
        let want = "\
node  state           replicas
------------------------------
   1  up                    12
  10  decommissioned         0
";
        assert_eq!(text, want, "\n{text}");
    }
}
