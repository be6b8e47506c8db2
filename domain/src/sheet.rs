//! A drop as a file: what `holdfast drop import|export` and
//! `PUT /api/v1/drops/{code}` carry, the changes an import makes, and the
//! problems that refuse one (each named by line and column).
//!
//! The CSV form is one row per SKU under a header naming [`CSV_COLUMNS`] (in any
//! order); the drop's own fields (`drop`, `drop_name`, `starts_at`, `ends_at`)
//! repeat on every row or are given once. The JSON form is [`DropSheet`].

use serde::{Deserialize, Serialize};

/// The CSV columns, in the order an export writes them.
pub const CSV_COLUMNS: [&str; 11] = [
    "drop",
    "drop_name",
    "starts_at",
    "ends_at",
    "sku",
    "product",
    "variant",
    "title",
    "stock",
    "per_buyer_limit",
    "low_stock_threshold",
];

/// Columns a CSV must have.
pub const REQUIRED_COLUMNS: [&str; 4] = ["drop", "sku", "product", "stock"];

/// Most SKUs one file may carry.
pub const MAX_SKUS: usize = 10_000;

/// Low-stock threshold of a SKU whose file leaves it blank.
pub const DEFAULT_LOW_STOCK_THRESHOLD: i32 = 5;

/// A drop and its SKUs, as a file describes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DropSheet {
    /// The drop's code (lower-case letters, digits and `-`); in a `PUT` it may be
    /// left out, the path gives it.
    #[serde(default)]
    pub code: String,
    /// Display name; blank: the code (a new drop) or unchanged (an existing one).
    #[serde(default)]
    pub name: String,
    /// When reservations open (RFC 3339); `null`: at once.
    #[serde(default)]
    pub starts_at: Option<String>,
    /// When reservations close (RFC 3339); `null`: never.
    #[serde(default)]
    pub ends_at: Option<String>,
    /// The SKUs, in the order the drop shows them.
    pub skus: Vec<SheetSku>,
}

/// One SKU of a [`DropSheet`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SheetSku {
    /// The SKU code (letters, digits and `. _ -`).
    pub sku: String,
    /// The product it is a variant of.
    pub product: String,
    /// Size, colour or edition, if any.
    #[serde(default)]
    pub variant: Option<String>,
    /// Human title; blank: the product and variant.
    #[serde(default)]
    pub title: Option<String>,
    /// Units the drop is given. A change moves on-hand stock by the difference
    /// (through the same atomic path as a feed); sales and feeds move on-hand
    /// stock without changing this figure, so importing a file again changes nothing.
    pub stock: i64,
    /// Most units one buyer may hold or buy; `null`: no limit.
    #[serde(default)]
    pub per_buyer_limit: Option<i32>,
    /// At or below this many available units the SKU reads "low stock";
    /// `null`: [`DEFAULT_LOW_STOCK_THRESHOLD`].
    #[serde(default)]
    pub low_stock_threshold: Option<i32>,
}

impl SheetSku {
    /// The title shown: the given one, else the product and variant.
    pub fn title_or_default(&self) -> String {
        match self.title.as_deref().map(str::trim) {
            Some(t) if !t.is_empty() => t.to_owned(),
            _ => match self.variant.as_deref().map(str::trim) {
                Some(v) if !v.is_empty() => format!("{} — {v}", self.product.trim()),
                _ => self.product.trim().to_owned(),
            },
        }
    }
}

/// Why a file was refused: where, and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Problem {
    /// The file's line (1 is a CSV's header); `null` in JSON, where `column`
    /// names the path instead.
    pub line: Option<u64>,
    /// The column or field, e.g. `stock` or `skus[3].stock`.
    pub column: String,
    /// What is wrong and what would be accepted.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}, column {}: {}", self.column, self.message),
            None => write!(f, "{}: {}", self.column, self.message),
        }
    }
}

/// One thing an import changes (or, in a dry run, would change).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Change {
    /// `create_drop`, `drop_field`, `add_sku`, `join_drop`, `sku_field` or `stock`.
    pub what: String,
    /// The SKU concerned, for SKU changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sku: Option<String>,
    /// The field changed, for `drop_field` and `sku_field`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The value before (`null`: none).
    #[serde(default)]
    pub from: Option<String>,
    /// The value after (`null`: none).
    #[serde(default)]
    pub to: Option<String>,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".to_owned());
        let sku = self.sku.as_deref().unwrap_or("");
        let field = self.field.as_deref().unwrap_or("");
        match self.what.as_str() {
            "create_drop" => write!(f, "create the drop, named {}", shown(&self.to)),
            "drop_field" => write!(
                f,
                "drop {field}: {} -> {}",
                shown(&self.from),
                shown(&self.to)
            ),
            "add_sku" => write!(f, "add new SKU {sku} with {} unit(s)", shown(&self.to)),
            "join_drop" => write!(f, "add existing SKU {sku} to the drop"),
            "stock" => write!(
                f,
                "{sku} stock: {} -> {} (on hand moves by the difference)",
                shown(&self.from),
                shown(&self.to)
            ),
            _ => write!(
                f,
                "{sku} {field}: {} -> {}",
                shown(&self.from),
                shown(&self.to)
            ),
        }
    }
}

/// What an import did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImportReport {
    /// The drop's code.
    pub code: String,
    /// Whether nothing was written (a preview).
    pub dry_run: bool,
    /// Every change, in the file's order; empty: the drop already matched the file.
    pub changes: Vec<Change>,
    /// SKUs of the drop the file does not list: left in the drop as they are.
    pub not_in_file: Vec<String>,
    /// What the import does that a merchandiser may not mean: a stock lowered
    /// below the units already sold (those sales become an oversell to
    /// remediate). Shown with the preview; the import goes ahead all the same.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Stock changes applied to the live counters by this call.
    pub stock_changes_applied: u64,
    /// Counters created by this call (SKUs that had none).
    pub counters_warmed: u64,
}

/// What an import answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "snake_case")]
pub enum ImportOutcome {
    /// Imported (or, in a dry run, previewed).
    Done(ImportReport),
    /// The file was refused; nothing changed.
    Refused(Vec<Problem>),
}

/// A CSV cell as a writer puts it: quoted when it holds a comma, quote or line break.
pub(crate) fn csv_cell(value: &str) -> String {
    if value.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value.to_owned()
    }
}

/// `sheet` as CSV: a header of [`CSV_COLUMNS`], then a row per SKU.
pub fn to_csv(sheet: &DropSheet) -> String {
    let mut out = CSV_COLUMNS.join(",");
    out.push('\n');
    for s in &sheet.skus {
        let opt = |v: &Option<String>| v.clone().unwrap_or_default();
        let num = |v: Option<i32>| v.map(|n| n.to_string()).unwrap_or_default();
        let cells = [
            sheet.code.clone(),
            sheet.name.clone(),
            opt(&sheet.starts_at),
            opt(&sheet.ends_at),
            s.sku.clone(),
            s.product.clone(),
            opt(&s.variant),
            s.title_or_default(),
            s.stock.to_string(),
            num(s.per_buyer_limit),
            num(s.low_stock_threshold),
        ];
        let row: Vec<String> = cells.iter().map(|c| csv_cell(c)).collect();
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

/// Most cells a row may have (the columns are [`CSV_COLUMNS`]; the rest is
/// room for a few unknown ones, each of which is a problem anyway).
const MAX_CELLS: usize = 4 * CSV_COLUMNS.len();

/// Splits CSV text into records, each with the line it starts on (RFC 4180:
/// quoted cells may hold commas, doubled quotes and line breaks). Reading
/// stops after the header and one row past [`MAX_SKUS`] (which is refused
/// then), and a row may have at most [`MAX_CELLS`] cells: a row in memory is
/// many times its text, so a file of short rows must not be read whole.
fn records(text: &str) -> Result<Vec<(u64, Vec<String>)>, Problem> {
    let mut out = Vec::new();
    let (mut line, mut start) = (1u64, 1u64);
    let (mut row, mut cell) = (Vec::new(), String::new());
    let (mut quoted, mut any) = (false, false);
    let mut chars = text.trim_start_matches('\u{feff}').chars().peekable();
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    cell.push('"');
                }
                '"' => quoted = false,
                '\n' => {
                    line += 1;
                    cell.push(c);
                }
                _ => cell.push(c),
            }
            continue;
        }
        match c {
            '"' if cell.is_empty() => {
                quoted = true;
                any = true;
            }
            ',' => {
                row.push(std::mem::take(&mut cell));
                any = true;
                if row.len() >= MAX_CELLS {
                    return Err(Problem {
                        line: Some(start),
                        column: String::new(),
                        message: format!("a row has at most {MAX_CELLS} cells"),
                    });
                }
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' | '\r' => {
                if any || !cell.is_empty() {
                    row.push(std::mem::take(&mut cell));
                    out.push((start, std::mem::take(&mut row)));
                    if out.len() > MAX_SKUS + 1 {
                        // The header and more SKUs than a file may carry: the
                        // caller refuses it on the count.
                        return Ok(out);
                    }
                }
                any = false;
                line += 1;
                start = line;
            }
            _ => {
                cell.push(c);
                any = true;
            }
        }
    }
    if quoted {
        return Err(Problem {
            line: Some(start),
            column: String::new(),
            message: "a quoted cell is never closed".into(),
        });
    }
    if any || !cell.is_empty() {
        row.push(cell);
        out.push((start, row));
    }
    Ok(out)
}

/// Reads CSV text into a sheet; cells are taken as written (trimmed) and
/// checked later, so every problem of the file can be reported at once. Along
/// with the sheet come the lines its SKUs were on, for those later problems.
pub fn parse_csv(text: &str) -> Result<(DropSheet, Vec<u64>), Vec<Problem>> {
    match parse_csv_partly(text)? {
        (sheet, lines, problems) if problems.is_empty() => Ok((sheet, lines)),
        (_, _, problems) => Err(problems),
    }
}

/// [`parse_csv`], keeping what it could read of a file with bad cells (a cell
/// that is not a number reads as blank) beside the problems, so the rest of the
/// file can still be checked; `Err` when not even the header could be read.
pub fn parse_csv_partly(text: &str) -> Result<(DropSheet, Vec<u64>, Vec<Problem>), Vec<Problem>> {
    let rows = records(text).map_err(|p| vec![p])?;
    let Some(((header_line, header), body)) = rows.split_first() else {
        return Err(vec![Problem {
            line: Some(1),
            column: String::new(),
            message: format!(
                "the file is empty: give a header ({})",
                CSV_COLUMNS.join(",")
            ),
        }]);
    };
    let mut problems = Vec::new();
    let names: Vec<String> = header.iter().map(|h| h.trim().to_lowercase()).collect();
    for (i, name) in names.iter().enumerate() {
        if !CSV_COLUMNS.contains(&name.as_str()) {
            let name = crate::text::clipped(name, 40);
            problems.push(Problem {
                line: Some(*header_line),
                message: format!(
                    "unknown column '{name}': the columns are {}",
                    CSV_COLUMNS.join(", ")
                ),
                column: name,
            });
        } else if names[..i].contains(name) {
            problems.push(Problem {
                line: Some(*header_line),
                column: name.clone(),
                message: "this column is given twice".into(),
            });
        }
    }
    for needed in REQUIRED_COLUMNS {
        if !names.iter().any(|n| n == needed) {
            problems.push(Problem {
                line: Some(*header_line),
                column: needed.into(),
                message: "this column is required".into(),
            });
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    if body.len() > MAX_SKUS {
        return Err(vec![Problem {
            line: Some(MAX_SKUS as u64 + 2),
            column: String::new(),
            message: format!("a file carries at most {MAX_SKUS} SKUs"),
        }]);
    }
    let mut sheet = DropSheet {
        code: String::new(),
        name: String::new(),
        starts_at: None,
        ends_at: None,
        skus: Vec::with_capacity(body.len()),
    };
    let mut lines = Vec::with_capacity(body.len());
    for (line, row) in body {
        let line = *line;
        if row.len() != names.len() {
            problems.push(Problem {
                line: Some(line),
                column: String::new(),
                message: format!("{} cell(s), the header has {}", row.len(), names.len()),
            });
            continue;
        }
        let cell = |name: &str| -> Option<String> {
            names
                .iter()
                .position(|n| n == name)
                .map(|i| row[i].trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        // The drop's fields: the same on every row that gives them.
        for (column, slot) in [
            ("drop", &mut sheet.code as &mut String),
            ("drop_name", &mut sheet.name),
        ] {
            if let Some(v) = cell(column) {
                if slot.is_empty() {
                    *slot = v;
                } else if *slot != v {
                    problems.push(Problem {
                        line: Some(line),
                        column: column.into(),
                        message: format!(
                            "'{v}' differs from '{slot}' given above: one drop per file"
                        ),
                    });
                }
            }
        }
        for (column, slot) in [
            ("starts_at", &mut sheet.starts_at),
            ("ends_at", &mut sheet.ends_at),
        ] {
            if let Some(v) = cell(column) {
                match slot {
                    None => *slot = Some(v),
                    Some(given) if *given != v => problems.push(Problem {
                        line: Some(line),
                        column: column.into(),
                        message: format!(
                            "'{v}' differs from '{given}' given above: one drop per file"
                        ),
                    }),
                    Some(_) => {}
                }
            }
        }
        let mut number = |column: &str| -> Option<i64> {
            let v = cell(column)?;
            match v.parse::<i64>() {
                Ok(n) => Some(n),
                Err(_) => {
                    problems.push(Problem {
                        line: Some(line),
                        column: column.into(),
                        message: format!("'{v}' is not a whole number"),
                    });
                    None
                }
            }
        };
        let stock = number("stock");
        let limit = number("per_buyer_limit");
        let threshold = number("low_stock_threshold");
        let small = |column: &str, v: Option<i64>, problems: &mut Vec<Problem>| {
            v.and_then(|n| match i32::try_from(n) {
                Ok(n) => Some(n),
                Err(_) => {
                    problems.push(Problem {
                        line: Some(line),
                        column: column.into(),
                        message: format!("{n} is too large"),
                    });
                    None
                }
            })
        };
        let per_buyer_limit = small("per_buyer_limit", limit, &mut problems);
        let low_stock_threshold = small("low_stock_threshold", threshold, &mut problems);
        sheet.skus.push(SheetSku {
            sku: cell("sku").unwrap_or_default(),
            product: cell("product").unwrap_or_default(),
            variant: cell("variant"),
            title: cell("title"),
            // A blank stock is reported by the checks (`-1` is refused there).
            stock: stock.unwrap_or(-1),
            per_buyer_limit,
            low_stock_threshold,
        });
        lines.push(line);
    }
    Ok((sheet, lines, problems))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sheet() -> DropSheet {
        DropSheet {
            code: "spring".into(),
            name: "Spring, \"limited\"".into(),
            starts_at: Some("2026-12-01T09:00:00Z".into()),
            ends_at: None,
            skus: vec![
                SheetSku {
                    sku: "SP-1".into(),
                    product: "Jacket".into(),
                    variant: Some("Red\nL".into()),
                    title: None,
                    stock: 40,
                    per_buyer_limit: Some(2),
                    low_stock_threshold: None,
                },
                SheetSku {
                    sku: "SP-2".into(),
                    product: "Scarf".into(),
                    variant: None,
                    title: Some("Scarf".into()),
                    stock: 0,
                    per_buyer_limit: None,
                    low_stock_threshold: Some(3),
                },
            ],
        }
    }

    #[test]
    fn a_file_of_many_short_rows_is_read_no_further_than_its_limit() {
        // 8 bytes a row in the text, far more each in memory: reading stops
        // one row past the limit (the count refuses it), and a row of
        // countless cells stops at its own bound.
        let text = format!("drop,sku,product,stock\n{}", "d,a,p,1\n".repeat(3_000_000));
        let rows = records(&text).unwrap();
        assert_eq!(rows.len(), MAX_SKUS + 2);
        let problems = parse_csv(&text).unwrap_err();
        assert!(
            problems[0].message.contains("at most 10000 SKUs"),
            "{problems:?}"
        );
        let wide = format!("drop,sku,product,stock\nd,a{}\n", ",".repeat(1_000_000));
        let problems = parse_csv(&wide).unwrap_err();
        assert_eq!(problems[0].line, Some(2));
        assert!(
            problems[0].message.contains("at most 44 cells"),
            "{problems:?}"
        );
        // A row as wide as the columns allow is read.
        let full = format!("drop,sku\nd,a{}\n", ",".repeat(MAX_CELLS - 2));
        assert_eq!(records(&full).unwrap()[1].1.len(), MAX_CELLS);
    }

    #[test]
    fn csv_round_trips_quotes_commas_and_line_breaks() {
        let s = sheet();
        let (back, lines) = parse_csv(&to_csv(&s)).expect("parses");
        // A blank title is written as the default one.
        let mut want = s.clone();
        want.skus[0].title = Some("Jacket — Red\nL".into());
        assert_eq!(back, want);
        // The first SKU's variant and title each hold a line break: the second
        // SKU starts on line 5.
        assert_eq!(lines, vec![2, 5]);
    }

    #[test]
    fn csv_problems_name_line_and_column() {
        let text = "drop,sku,product,stock,colour\nd,A,P,1,x\n";
        let e = parse_csv(text).unwrap_err();
        assert_eq!(e[0].line, Some(1));
        assert_eq!(e[0].column, "colour");

        let text = "sku,product,stock,drop\nA,P,5,d\r\nB,P,five,d\nC,P,1,other\n";
        let e = parse_csv(text).unwrap_err();
        let at: Vec<(Option<u64>, &str)> = e.iter().map(|p| (p.line, p.column.as_str())).collect();
        assert_eq!(at, vec![(Some(3), "stock"), (Some(4), "drop")]);
        assert!(
            parse_csv("drop,sku\n")
                .unwrap_err()
                .iter()
                .any(|p| p.column == "stock")
        );
        assert_eq!(
            parse_csv("drop,sku,product,stock\n\"d,1,2,3\n").unwrap_err()[0].line,
            Some(2)
        );
    }
}
