//! CSV for spreadsheets (`augur study export --format csv`), by the same rule as the
//! dashboard's "Export CSV" (`dashboard/assets/js/csv.js`).

use serde_json::Value;

/// What makes text a formula when it starts with it (csv.js: `FORMULA_START`).
const FORMULA_START: [char; 7] = ['=', '+', '-', '@', '\t', '\r', '\0'];
/// What a cell must be quoted for (csv.js: `NEEDS_QUOTES`).
const NEEDS_QUOTES: [char; 6] = ['"', ',', ';', '\t', '\r', '\n'];

/// One field: numbers and booleans as they are, text neutralised and quoted as needed.
///
/// CSV for spreadsheets (`augur study export --format csv`), by the same rule as the
/// dashboard's "Export CSV" (`dashboard/assets/js/csv.js`, whose header says why): a text
/// cell that a spreadsheet would run as a formula (it starts with `=`, `+`, `-`, `@`, a tab,
/// a carriage return or NUL, and is not just a number) gets a leading `'` and is quoted; a
/// cell holding a quote, a comma, a semicolon (the list separator in many locales, where
/// `;=1+1` would split into a cell of its own that runs), a tab or a line break is quoted.
/// Numbers stay numbers. A unit test keeps the two rules' characters the same.
pub fn csv_cell(value: &Value) -> String {
    let text = match value {
        Value::Null => return String::new(),
        Value::Number(n) => return n.to_string(),
        Value::Bool(b) => return b.to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let formula = text.starts_with(FORMULA_START) && !is_plain_number(&text);
    let text = if formula { format!("'{text}") } else { text };
    if formula || text.contains(NEEDS_QUOTES) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

/// csv.js's `PLAIN_NUMBER`, `^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$`: text that is only a
/// number (a category `-1`), which no spreadsheet runs.
fn is_plain_number(s: &str) -> bool {
    fn digits(s: &str) -> (usize, &str) {
        let n = s.bytes().take_while(u8::is_ascii_digit).count();
        (n, &s[n..])
    }
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (whole, rest) = digits(s);
    let rest = match rest.strip_prefix('.') {
        Some(after) => {
            let (fraction, rest) = digits(after);
            if whole == 0 && fraction == 0 {
                return false;
            }
            rest
        }
        None if whole == 0 => return false,
        None => rest,
    };
    match rest.strip_prefix(['e', 'E']) {
        None => rest.is_empty(),
        Some(exponent) => {
            let exponent = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            let (n, rest) = digits(exponent);
            n > 0 && rest.is_empty()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_rule_is_the_dashboards() {
        let js = include_str!("../dashboard/assets/js/csv.js");
        assert!(
            js.contains(r"const FORMULA_START = /^[=+\-@\t\r\0]/;"),
            "csv.js changed"
        );
        assert!(
            js.contains(r#"const NEEDS_QUOTES = /[",;\t\r\n]/;"#),
            "csv.js changed"
        );
        assert!(js.contains(r"const PLAIN_NUMBER = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;"));
    }

    #[test]
    fn formulas_are_neutralised_separators_quoted_and_numbers_kept() {
        let cell = |v: Value| csv_cell(&v);
        assert_eq!(cell(json!("=1+1")), "\"'=1+1\"");
        assert_eq!(cell(json!("\t=1")), "\"'\t=1\"");
        assert_eq!(cell(json!("\0=1")), "\"'\0=1\"");
        assert_eq!(cell(json!(";=1+1")), "\";=1+1\"");
        assert_eq!(cell(json!("a\"b")), "\"a\"\"b\"");
        assert_eq!(cell(json!("adam")), "adam");
        assert_eq!(cell(json!("-1")), "-1");
        assert_eq!(cell(json!("+.5e-3")), "+.5e-3");
        assert_eq!(cell(json!("-1x")), "\"'-1x\"");
        assert_eq!(cell(json!(-0.5)), "-0.5");
        assert_eq!(cell(json!(true)), "true");
        assert_eq!(cell(Value::Null), "");
    }

    #[test]
    fn plain_numbers_are_what_the_dashboards_pattern_matches() {
        for yes in ["1", "-1", "+1.", "1.5", ".5", "-.5e3", "2E+10", "007"] {
            assert!(is_plain_number(yes), "{yes}");
        }
        for no in [
            "", "-", ".", "-.", "1e", "1e+", "1.2.3", "--1", "1 ", "0x1", "-1,2",
        ] {
            assert!(!is_plain_number(no), "{no}");
        }
    }
}
