// The study page's trial table: every trial of the study held as columns (one request, then
// merged with live changes), a view that filters and sorts row indices, and a virtualised
// table that puts only the rows on screen into the DOM, so 50,000 trials scroll smoothly.

import { fmt, h, stateBadge } from './dom.js';

const ROW_PX = 26; // matches --row in style.css
const STATES = ['requested', 'active', 'stopping', 'paused', 'completed', 'infeasible', 'failed'];

/**
 * Every trial of a study as columns, from `GET /v1/studies/{study}/table`. A row is an index
 * into each column; column keys are `id`, `state`, `m:<metric>`, `p:<parameter>`, `tags` and
 * `u:<user attribute>`.
 */
export class TrialColumns {
  constructor(table) {
    /** Metric ids and parameter ids, in the study's order. */
    this.metrics = table.metrics.map((m) => m.id);
    this.parameters = table.parameters.map((p) => p.id);
    /** Trial id by row. */
    this.ids = table.ids;
    /** Trial state by row. */
    this.states = table.states;
    /** Ids of the trials an early-stopping rule stopped. */
    this.earlyStopped = new Set(table.early_stopped);
    /** Final value by row, per metric id (null when not reported). */
    this.values = table.values;
    /** Parameter value by row, per parameter id (categories as strings, null when inactive). */
    this.params = table.params;
    /** User attribute value by row, per name (null when unset), and the names in order. */
    this.userAttrs = table.user_attrs;
    this.attrNames = Object.keys(table.user_attrs).sort();
    /** Tags by row (lists), and notes by row (null when none). */
    this.tags = table.tags;
    this.notes = table.notes;
    /** Multi-fidelity studies: the latest budget by row (null: the full budget); else null. */
    this.budgets = table.budgets || null;
    /** Row by trial id. */
    this.rowOf = new Map(this.ids.map((id, row) => [id, row]));
  }

  get length() { return this.ids.length; }

  /** Writes a trial from `changes` into its row, appending a row for a new trial. */
  upsert(trial) {
    let row = this.rowOf.get(trial.id);
    if (row == null) {
      row = this.ids.length;
      this.rowOf.set(trial.id, row);
    }
    this.ids[row] = trial.id;
    this.states[row] = trial.state;
    if (trial.early_stopped) this.earlyStopped.add(trial.id); else this.earlyStopped.delete(trial.id);
    const finals = trial.final_measurement ? trial.final_measurement.metrics : {};
    for (const m of this.metrics) this.values[m][row] = finals[m] == null ? null : finals[m];
    for (const p of this.parameters) this.params[p][row] = trial.parameters[p] == null ? null : trial.parameters[p];
    this.tags[row] = trial.tags || [];
    if (trial.budget != null && !this.budgets) this.budgets = new Array(this.ids.length).fill(null);
    if (this.budgets) this.budgets[row] = trial.budget == null ? null : trial.budget;
    this.notes[row] = trial.note == null ? null : trial.note;
    const attrs = trial.user_attrs || {};
    for (const name of Object.keys(attrs)) {
      if (!this.userAttrs[name]) {
        // A name no trial had: a new column, empty above.
        this.userAttrs[name] = new Array(this.ids.length).fill(null);
        this.attrNames = Object.keys(this.userAttrs).sort();
      }
    }
    for (const name of this.attrNames) this.userAttrs[name][row] = attrs[name] == null ? null : attrs[name];
  }

  /** Every tag any trial has, sorted. */
  allTags() {
    return [...new Set(this.tags.flat())].sort();
  }

  /** The value in column `key` at `row`. */
  cell(key, row) {
    if (key === 'id') return this.ids[row];
    if (key === 'state') return this.states[row];
    if (key === 'budget') return this.budgets ? this.budgets[row] : null;
    if (key === 'tags') return this.tags[row].length ? this.tags[row].join(', ') : null;
    if (key.startsWith('m:')) return this.values[key.slice(2)][row];
    if (key.startsWith('u:')) {
      const v = this.userAttrs[key.slice(2)][row];
      return v != null && typeof v === 'object' ? JSON.stringify(v) : v;
    }
    return this.params[key.slice(2)][row];
  }

  /** The numeric column a range filter reads: a parameter's (`lr`) or a user attribute's (`u:name`). */
  rangeColumn(key) {
    return key.startsWith('u:') ? this.userAttrs[key.slice(2)] : this.params[key];
  }

  /** How many trials are in each state. */
  countStates() {
    const counts = Object.fromEntries(STATES.map((s) => [s, 0]));
    for (const state of this.states) counts[state] += 1;
    return counts;
  }

  /** The best completed trial for a metric, as `{ trial, value }`, or null. */
  best(metric, maximize) {
    const column = this.values[metric];
    let best = null;
    for (let row = 0; row < this.ids.length; row++) {
      const v = column[row];
      if (v == null || this.states[row] !== 'completed') continue;
      if (!best || (maximize ? v > best.value : v < best.value)) best = { trial: this.ids[row], value: v };
    }
    return best;
  }

  /**
   * The best-so-far line over completed trials in id order: a step at every improvement, then
   * on to the last trial id. Computed from the full columns, so it is exact even when the
   * chart's points are a sample.
   */
  bestSoFar(metric, maximize) {
    const done = [];
    let ordered = true;
    for (let row = 0; row < this.ids.length; row++) {
      const v = this.values[metric][row];
      if (v != null && this.states[row] === 'completed') {
        if (done.length && done[done.length - 1][0] > this.ids[row]) ordered = false;
        done.push([this.ids[row], v]);
      }
    }
    if (!ordered) done.sort((a, b) => a[0] - b[0]);
    const x = [];
    const y = [];
    let best = null;
    for (const [id, v] of done) {
      if (best == null || (maximize ? v > best : v < best)) { best = v; x.push(id); y.push(v); }
    }
    if (x.length) { x.push(this.ids.reduce((a, b) => (a > b ? a : b), 0)); y.push(best); }
    return { x, y };
  }
}

/**
 * Which rows the table shows, in which order: a state, a parameter range, the parallel
 * coordinates' brush (a predicate over rows), and a sort column.
 */
export class TableView {
  sortKey = 'id';
  descending = false;
  filter = { state: '', param: '', min: '', max: '', tag: '' };
  /** `(row) => boolean`, or null when nothing is brushed. */
  brush = null;
  /** The rows shown, in order. */
  rows = new Int32Array(0);

  /** A click on a column: the same column flips its direction; metrics start best-high. */
  sortBy(key) {
    this.descending = this.sortKey === key ? !this.descending : key.startsWith('m:');
    this.sortKey = key;
  }

  /** Filters, then sorts; 50,000 rows take a few tens of milliseconds. */
  recompute(columns) {
    const n = columns.length;
    const f = this.filter;
    const lo = f.min === '' ? -Infinity : Number(f.min);
    const hi = f.max === '' ? Infinity : Number(f.max);
    const ranged = f.param && (f.min !== '' || f.max !== '') ? columns.rangeColumn(f.param) : null;
    const out = new Int32Array(n);
    let k = 0;
    for (let row = 0; row < n; row++) {
      if (f.state && columns.states[row] !== f.state) continue;
      if (f.tag && !columns.tags[row].includes(f.tag)) continue;
      if (ranged) {
        const v = ranged[row];
        if (typeof v !== 'number' || v < lo || v > hi) continue;
      }
      if (this.brush && !this.brush(row)) continue;
      out[k++] = row;
    }
    const rows = out.subarray(0, k);
    if (this.sortKey !== 'id' || this.descending) sortRows(rows, columns, this.sortKey, this.descending);
    this.rows = rows;
  }
}

/** Sorts rows by a column; empty cells last whatever the direction, ties by trial id. */
function sortRows(rows, columns, key, descending) {
  const values = new Array(columns.length);
  for (const row of rows) values[row] = columns.cell(key, row);
  const dir = descending ? -1 : 1;
  const ids = columns.ids;
  rows.sort((a, b) => {
    const x = values[a];
    const y = values[b];
    if (x == null && y == null) return ids[a] - ids[b];
    if (x == null) return 1;
    if (y == null) return -1;
    if (x < y) return -dir;
    if (x > y) return dir;
    return ids[a] - ids[b];
  });
}

/**
 * The virtualised table of a view over columns: a sortable header, the rows on screen (a
 * click opens the trial) and a "n of m trials" count. `refresh()` recomputes the view and
 * redraws; call it after any change to the columns or the view.
 */
export function trialTable(study, columns, view) {
  // Recomputed on each redraw: a user attribute may appear with a live change.
  const columnKeys = () => [['id', 'trial'], ['state', 'state'], ...(columns.budgets ? [['budget', 'budget']] : []),
    ...columns.metrics.map((m) => ['m:' + m, m]), ...columns.parameters.map((p) => ['p:' + p, p]),
    ['tags', 'tags'], ...columns.attrNames.map((a) => ['u:' + a, a])];
  let keys = columnKeys();
  const head = h('div', { class: 'vt-head' });
  const rowsEl = h('div', { class: 'vt-rows' });
  const spacer = h('div', {});
  const scroller = h('div', { class: 'vt', id: 'trial-table' }, spacer, rowsEl);
  const count = h('span', { id: 'row-count', class: 'muted' });

  function drawHead() {
    head.replaceChildren(...keys.map(([key, label]) => h('div', {
      class: view.sortKey === key ? 'sorted' : '', 'data-key': key,
      onclick: () => { view.sortBy(key); refresh(); },
    }, label + (view.sortKey === key ? (view.descending ? ' ▼' : ' ▲') : ''))));
  }

  function rowElement(row) {
    const id = columns.ids[row];
    const cells = keys.map(([key]) => (key === 'state'
      ? h('div', {}, stateBadge(columns.states[row]), columns.earlyStopped.has(id) ? ' ✂' : '')
      : h('div', {}, fmt(columns.cell(key, row)))));
    return h('div', { class: 'vt-row', 'data-trial': id, onclick: () => { location.href = `/studies/${study}/trials/${id}`; } }, cells);
  }

  let drawn = [-1, -1];
  // Only the rows in the scrolled window, plus a few either side.
  function drawRows(force) {
    const first = Math.max(0, Math.floor(scroller.scrollTop / ROW_PX) - 5);
    const last = Math.min(view.rows.length, first + Math.ceil(scroller.clientHeight / ROW_PX) + 10);
    if (!force && drawn[0] === first && drawn[1] === last) return;
    drawn = [first, last];
    const elements = [];
    for (let k = first; k < last; k++) elements.push(rowElement(view.rows[k]));
    rowsEl.style.transform = `translateY(${first * ROW_PX}px)`;
    rowsEl.replaceChildren(...elements);
  }

  let frame = 0;
  scroller.addEventListener('scroll', () => {
    if (!frame) frame = requestAnimationFrame(() => { frame = 0; drawRows(false); });
  });

  function refresh() {
    keys = columnKeys();
    view.recompute(columns);
    spacer.style.height = view.rows.length * ROW_PX + 'px';
    drawHead();
    drawRows(true);
    count.textContent = `${view.rows.length} of ${columns.length} trials`;
  }
  return { el: h('div', {}, head, scroller), count, refresh };
}
