// CSV files for spreadsheets: the study page's "Export CSV" of the rows its table shows.
//
// A spreadsheet runs a cell that starts with `=`, `+`, `-` or `@` as a formula, also behind a
// leading tab, carriage return or NUL: `=HYPERLINK("http://evil.example","x")` as a
// categorical value would become a live link (issue 10, finding 8). As OWASP and ASVS 1.2.10
// recommend, such text gets a leading `'` (the spreadsheet shows it as text and runs nothing)
// and is quoted; other fields are quoted as RFC 4180 says when they hold a quote, a comma, a
// semicolon (the list separator in many locales), a tab or a line break. Numbers stay
// numbers: a metric of -0.5 is written `-0.5`, as is text that is only a number (a category
// "-1"), which no spreadsheet can run.

import { h } from './dom.js';

const FORMULA_START = /^[=+\-@\t\r\0]/;
const PLAIN_NUMBER = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;
const NEEDS_QUOTES = /[",;\t\r\n]/;

/** One field: numbers and booleans as they are, text neutralised and quoted as needed. */
export function csvCell(value) {
  if (value == null) return '';
  if (typeof value !== 'string') return String(value);
  const formula = FORMULA_START.test(value) && !PLAIN_NUMBER.test(value);
  const text = formula ? "'" + value : value;
  return formula || NEEDS_QUOTES.test(text) ? '"' + text.replace(/"/g, '""') + '"' : text;
}

/** A CSV document from rows of values. */
export const csvDocument = (rows) => rows.map((row) => row.map(csvCell).join(',')).join('\n') + '\n';

/** Offers `text` to the browser as a file download. */
export function download(filename, text, type) {
  const link = h('a', { href: URL.createObjectURL(new Blob([text], { type })), download: filename });
  document.body.append(link);
  link.click();
  setTimeout(() => { URL.revokeObjectURL(link.href); link.remove(); }, 1000);
}

/** The rows a trial table's view shows, in its order, as `study-<id>-trials.csv`. */
export function exportTrialsCsv(study, columns, view) {
  const { metrics, parameters, attrNames } = columns;
  const rows = [['trial', 'state', 'early_stopped', ...metrics, ...parameters, 'tags', ...attrNames]];
  for (const row of view.rows) {
    const id = columns.ids[row];
    rows.push([id, columns.states[row], columns.earlyStopped.has(id),
      ...metrics.map((m) => columns.values[m][row]), ...parameters.map((p) => columns.params[p][row]),
      columns.tags[row].join(' '), ...attrNames.map((a) => columns.cell('u:' + a, row))]);
  }
  download(`study-${study}-trials.csv`, csvDocument(rows), 'text/csv');
}
