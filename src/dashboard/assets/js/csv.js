// CSV files for spreadsheets: the study page's "Export CSV" of the rows its table shows.

import { h } from './dom.js';

/** One field, quoted when it holds a quote, a comma or a line break. */
export function csvCell(value) {
  if (value == null) return '';
  const text = String(value);
  return /[",\n]/.test(text) ? '"' + text.replace(/"/g, '""') + '"' : text;
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
  const { metrics, parameters } = columns;
  const rows = [['trial', 'state', 'early_stopped', ...metrics, ...parameters]];
  for (const row of view.rows) {
    const id = columns.ids[row];
    rows.push([id, columns.states[row], columns.earlyStopped.has(id),
      ...metrics.map((m) => columns.values[m][row]), ...parameters.map((p) => columns.params[p][row])]);
  }
  download(`study-${study}-trials.csv`, csvDocument(rows), 'text/csv');
}
