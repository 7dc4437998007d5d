// Augur dashboard. Plain JavaScript, no build step: each page shell names its page in
// <body data-page>, this script draws it from the JSON API. The study page keeps every trial
// as columns in memory (one request), renders only the table rows on screen, and follows
// GET /v1/studies/{id}/changes to stay live; chart aggregates come from the server.
'use strict';

const ROW = 26; // px, matches --row in style.css
const POLL_MS = 400; // live-update poll interval
const INSIGHTS_EVERY_MS = 15000; // heavy charts refresh at most this often while trials change

// Timings the browser test reads (ms since navigation start).
window.augur = { marks: {}, updates: 0 };
const mark = (name) => { if (!(name in window.augur.marks)) window.augur.marks[name] = performance.now(); };

const $ = (sel, el = document) => el.querySelector(sel);
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const kid of kids.flat()) {
    if (kid == null) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

async function api(path) {
  const r = await fetch(path, { headers: { Accept: 'application/json' }, credentials: 'same-origin' });
  if (r.status === 401) {
    location.href = '/login?next=' + encodeURIComponent(location.pathname + location.search);
    throw new Error('sign in first');
  }
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error((body.error && body.error.message) || r.statusText);
  return body;
}

let plotlyPromise = null;
// plotly.js is 4.6 MB: loaded after the first paint of numbers and tables, never blocking it.
function plotly() {
  if (!plotlyPromise) {
    plotlyPromise = new Promise((resolve, reject) => {
      const s = document.createElement('script');
      s.src = '/dashboard/plotly.min.js?v=' + document.body.dataset.version;
      s.onload = () => resolve(window.Plotly);
      s.onerror = () => reject(new Error('could not load plotly.js'));
      document.head.append(s);
    });
  }
  return plotlyPromise;
}
const PLOT_CONFIG = { displaylogo: false, responsive: true };
const baseLayout = (extra) => Object.assign({
  margin: { l: 56, r: 16, t: 8, b: 40 }, height: 320, hovermode: 'closest',
  paper_bgcolor: '#fff', plot_bgcolor: '#fff', showlegend: false,
}, extra);

function fmt(v) {
  if (v == null || v === '') return '';
  if (typeof v !== 'number') return String(v);
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  return (a !== 0 && (a < 1e-3 || a >= 1e6)) ? v.toExponential(4) : String(Number(v.toPrecision(6)));
}
const stateBadge = (s) => h('span', { class: 'state ' + s }, s);
const isUnfinished = (s) => s === 'requested' || s === 'active' || s === 'stopping';
function showError(e) {
  $('#main').prepend(h('p', { class: 'error' }, String(e.message || e)));
}

// ---------------------------------------------------------------- studies page
async function studiesPage() {
  const params = new URLSearchParams(location.search);
  const state = h('select', { id: 'filter-state' },
    ['', 'active', 'completed', 'stopped', 'failed'].map((s) => h('option', { value: s }, s || 'any state')));
  state.value = params.get('state') || '';
  const name = h('input', { id: 'filter-name', placeholder: 'name contains', value: params.get('name') || '' });
  const body = h('tbody');
  const count = h('span', { class: 'muted', id: 'study-count' });
  $('#main').replaceChildren(
    h('h1', {}, 'Studies'),
    h('div', { class: 'card' },
      h('div', { class: 'bar' }, state, name, count),
      h('table', { class: 'plain', id: 'studies' },
        h('thead', {}, h('tr', {}, ['id', 'name', 'state', 'algorithm', 'progress', 'done / running / failed of max', 'best value', 'created'].map((c) => h('th', {}, c)))),
        body)));
  let seq = 0;
  async function load() {
    const mine = ++seq;
    const q = new URLSearchParams();
    if (state.value) q.set('state', state.value);
    if (name.value.trim()) q.set('name', name.value.trim());
    history.replaceState(null, '', q.toString() ? '/?' + q : '/');
    q.set('page_size', '1000');
    let studies = [];
    let token = null;
    for (let page = 0; page < 20; page++) { // bounded: 20,000 studies at most
      if (token) q.set('page_token', token);
      const r = await api('/v1/studies?' + q);
      studies = studies.concat(r.studies);
      token = r.next_page_token;
      if (!token) break;
    }
    if (mine !== seq) return;
    body.replaceChildren(...studies.map(studyRow));
    count.textContent = studies.length + (studies.length === 1 ? ' study' : ' studies');
    mark('studies');
  }
  let timer = null;
  state.addEventListener('change', load);
  name.addEventListener('input', () => { clearTimeout(timer); timer = setTimeout(load, 200); });
  await load();
}

function studyRow(s) {
  const c = s.trial_counts;
  const max = s.spec.max_trials || 1;
  const running = c.requested + c.active + c.stopping;
  const failed = c.failed + c.infeasible;
  const pct = (n) => Math.min(100, (100 * n) / max) + '%';
  const metric = s.spec.metrics[0];
  const best = s.best_trial && s.best_trial.final_measurement
    ? s.best_trial.final_measurement.metrics[metric.id] : null;
  return h('tr', { 'data-study': s.id },
    h('td', {}, s.id),
    h('td', {}, h('a', { href: '/studies/' + s.id }, s.name)),
    h('td', {}, stateBadge(s.state)),
    h('td', {}, s.spec.algorithm),
    h('td', {}, h('div', { class: 'progress', title: `${c.completed} done, ${running} running, ${failed} failed` },
      h('span', { class: 'done', style: 'width:' + pct(c.completed) }),
      h('span', { class: 'run', style: 'width:' + pct(running) }),
      h('span', { class: 'fail', style: 'width:' + pct(failed) }))),
    h('td', {}, `${c.completed} / ${running} / ${failed} of ${max}`),
    h('td', { class: 'best' }, s.spec.metrics.length > 1 ? h('span', { class: 'muted' }, 'Pareto set') : (best == null ? '' : `${fmt(best)} (${metric.id})`)),
    h('td', {}, new Date(s.created_at).toLocaleString()));
}

// ---------------------------------------------------------------- study page
// Every trial as columns; rows are indices. `index` maps a trial id to its row.
const T = { ids: [], states: [], stopped: new Set(), values: {}, params: {}, index: new Map() };
const V = { view: new Int32Array(0), sortKey: 'id', desc: false, filter: { state: '', param: '', min: '', max: '' }, brush: null };

function setRow(row, t, metrics, params) {
  T.ids[row] = t.id;
  T.states[row] = t.state;
  if (t.early_stopped) T.stopped.add(t.id); else T.stopped.delete(t.id);
  const m = t.final_measurement ? t.final_measurement.metrics : {};
  for (const k of metrics) T.values[k][row] = m[k] == null ? null : m[k];
  for (const p of params) T.params[p][row] = t.parameters[p] == null ? null : t.parameters[p];
}

function columnValue(key, row) {
  if (key === 'id') return T.ids[row];
  if (key === 'state') return T.states[row];
  if (key.startsWith('m:')) return T.values[key.slice(2)][row];
  return T.params[key.slice(2)][row];
}

// Filter then sort the rows; 50,000 rows take a few tens of milliseconds.
function recomputeView() {
  const n = T.ids.length;
  const f = V.filter;
  const lo = f.min === '' ? -Infinity : Number(f.min);
  const hi = f.max === '' ? Infinity : Number(f.max);
  const col = f.param ? T.params[f.param] : null;
  const out = new Int32Array(n);
  let k = 0;
  for (let i = 0; i < n; i++) {
    if (f.state && T.states[i] !== f.state) continue;
    if (col && (f.min !== '' || f.max !== '')) {
      const v = col[i];
      if (typeof v !== 'number' || v < lo || v > hi) continue;
    }
    if (V.brush && !V.brush(i)) continue;
    out[k++] = i;
  }
  const rows = out.subarray(0, k);
  const key = V.sortKey;
  if (key !== 'id' || V.desc) {
    const vals = new Array(n);
    for (const i of rows) vals[i] = columnValue(key, i);
    const dir = V.desc ? -1 : 1;
    rows.sort((a, b) => {
      const x = vals[a]; const y = vals[b];
      if (x == null && y == null) return T.ids[a] - T.ids[b];
      if (x == null) return 1; // empty cells last, whatever the direction
      if (y == null) return -1;
      if (x < y) return -dir;
      if (x > y) return dir;
      return T.ids[a] - T.ids[b];
    });
  }
  V.view = rows;
}

function trialTable(study, metrics, params) {
  const cols = [['id', 'trial'], ['state', 'state'], ...metrics.map((m) => ['m:' + m, m]), ...params.map((p) => ['p:' + p, p])];
  const head = h('div', { class: 'vt-head' });
  const rowsEl = h('div', { class: 'vt-rows' });
  const spacer = h('div', {});
  const scroller = h('div', { class: 'vt', id: 'trial-table' }, spacer, rowsEl);
  function drawHead() {
    head.replaceChildren(...cols.map(([key, label]) => h('div', {
      class: V.sortKey === key ? 'sorted' : '', 'data-key': key,
      onclick: () => { V.desc = V.sortKey === key ? !V.desc : key.startsWith('m:'); V.sortKey = key; refresh(); },
    }, label + (V.sortKey === key ? (V.desc ? ' ▼' : ' ▲') : ''))));
  }
  let drawn = [-1, -1];
  function drawRows(force) {
    const first = Math.max(0, Math.floor(scroller.scrollTop / ROW) - 5);
    const last = Math.min(V.view.length, first + Math.ceil(scroller.clientHeight / ROW) + 10);
    if (!force && drawn[0] === first && drawn[1] === last) return;
    drawn = [first, last];
    const frag = [];
    for (let k = first; k < last; k++) {
      const i = V.view[k];
      const id = T.ids[i];
      const cells = cols.map(([key]) => {
        if (key === 'state') return h('div', {}, stateBadge(T.states[i]), T.stopped.has(id) ? ' ✂' : '');
        return h('div', {}, fmt(columnValue(key, i)));
      });
      frag.push(h('div', { class: 'vt-row', 'data-trial': id, onclick: () => { location.href = `/studies/${study}/trials/${id}`; } }, cells));
    }
    rowsEl.style.transform = `translateY(${first * ROW}px)`;
    rowsEl.replaceChildren(...frag);
  }
  let frame = 0;
  scroller.addEventListener('scroll', () => { if (!frame) frame = requestAnimationFrame(() => { frame = 0; drawRows(false); }); });
  function refresh() {
    recomputeView();
    spacer.style.height = V.view.length * ROW + 'px';
    drawHead();
    drawRows(true);
    $('#row-count').textContent = `${V.view.length} of ${T.ids.length} trials`;
  }
  return { el: h('div', {}, head, scroller), refresh };
}

function csvCell(v) {
  if (v == null) return '';
  const s = String(v);
  return /[",\n]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
}

function exportCsv(study, metrics, params) {
  const lines = [['trial', 'state', 'early_stopped', ...metrics, ...params].map(csvCell).join(',')];
  for (const i of V.view) {
    lines.push([T.ids[i], T.states[i], T.stopped.has(T.ids[i]), ...metrics.map((m) => T.values[m][i]), ...params.map((p) => T.params[p][i])].map(csvCell).join(','));
  }
  const blob = new Blob([lines.join('\n') + '\n'], { type: 'text/csv' });
  const a = h('a', { href: URL.createObjectURL(blob), download: `study-${study}-trials.csv` });
  document.body.append(a);
  a.click();
  setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
}

async function studyPage() {
  const study = Number(document.body.dataset.study);
  const main = $('#main');
  // The study's numbers come first (two indexed queries): the page says something useful
  // while the full table is still on its way.
  const tablePromise = api(`/v1/studies/${study}/table`);
  // Asked for at once too: the server loads the trials once for both requests.
  let firstInsights = api(`/v1/studies/${study}/insights`);
  firstInsights.catch(() => {});
  plotly().catch(() => {});
  const info = await api(`/v1/studies/${study}`);
  document.title = `${info.name} · Augur`;
  const c0 = info.trial_counts;
  const best0 = info.best_trial && info.best_trial.final_measurement ? info.best_trial.final_measurement.metrics[info.spec.metrics[0].id] : null;
  main.replaceChildren(
    h('h1', {}, info.name, ' ', stateBadge(info.state), ' ', h('span', { class: 'muted' }, `#${study} · ${info.spec.algorithm}`)),
    h('div', { class: 'card' }, h('div', { class: 'stats', id: 'stats' },
      h('div', { class: 'stat' }, h('div', { class: 'v', id: 'best-value' }, best0 == null ? '–' : fmt(best0)), h('div', { class: 'k' }, 'best ' + info.spec.metrics[0].id)),
      h('div', { class: 'stat' }, h('div', { class: 'v' }, c0.completed), h('div', { class: 'k' }, 'completed')),
      h('div', { class: 'stat' }, h('div', { class: 'v' }, c0.total), h('div', { class: 'k' }, 'trials')))),
    h('p', { class: 'muted' }, 'Loading trials…'));
  mark('summary');
  const table = await tablePromise;
  const metrics = table.metrics.map((m) => m.id);
  const goals = Object.fromEntries(table.metrics.map((m) => [m.id, m.goal]));
  const params = table.parameters.map((p) => p.id);
  const axes = Object.fromEntries(table.parameters.map((p) => [p.id, p]));
  let metric = metrics[0];
  T.ids = table.ids; T.states = table.states; T.stopped = new Set(table.early_stopped);
  T.values = table.values; T.params = table.params;
  T.index = new Map(T.ids.map((id, i) => [id, i]));
  let cursor = table.cursor;

  const stats = h('div', { class: 'stats', id: 'stats' });
  const metricSel = h('select', { id: 'metric' }, metrics.map((m) => h('option', { value: m }, `${m} (${goals[m]})`)));
  const stateSel = h('select', { id: 'table-state' }, ['', 'requested', 'active', 'stopping', 'completed', 'infeasible', 'failed'].map((s) => h('option', { value: s }, s || 'any state')));
  const paramSel = h('select', { id: 'table-param' }, h('option', { value: '' }, 'parameter…'), params.filter((p) => !axes[p].categories.length).map((p) => h('option', { value: p }, p)));
  const minIn = h('input', { id: 'table-min', class: 'num', placeholder: 'min', inputmode: 'decimal' });
  const maxIn = h('input', { id: 'table-max', class: 'num', placeholder: 'max', inputmode: 'decimal' });
  const tbl = trialTable(study, metrics, params);
  const xSel = h('select', { id: 'contour-x' }, params.map((p) => h('option', { value: p }, p)));
  const ySel = h('select', { id: 'contour-y' }, params.map((p) => h('option', { value: p }, p)));
  if (params.length > 1) ySel.value = params[1];
  const multi = metrics.length > 1;
  main.replaceChildren(
    h('h1', {}, info.name, ' ', stateBadge(info.state), ' ', h('span', { class: 'muted' }, `#${study} · ${info.spec.algorithm}`)),
    h('div', { class: 'card' }, h('div', { class: 'bar' }, h('span', { class: 'live', title: 'live' }), 'Metric', metricSel,
      h('a', { href: `/compare?studies=${study}` }, 'compare…')), stats),
    h('div', { class: multi ? 'grid2' : '' },
      h('div', { class: 'card' }, h('h2', {}, 'Optimization history'), h('div', { id: 'chart-history', class: 'chart' })),
      multi ? h('div', { class: 'card' }, h('h2', {}, `Pareto front (${metrics[0]} vs ${metrics[1]})`), h('div', { id: 'chart-pareto', class: 'chart' })) : null),
    h('div', { class: 'card' }, h('h2', {}, 'Trials'),
      h('div', { class: 'bar' }, stateSel, paramSel, minIn, maxIn,
        h('button', { id: 'export-csv', class: 'secondary', onclick: () => exportCsv(study, metrics, params) }, 'Export CSV'),
        h('span', { id: 'row-count', class: 'muted' })),
      tbl.el),
    h('div', { class: 'grid2' },
      h('div', { class: 'card' }, h('h2', {}, 'Parameter importance (PED-ANOVA)'), h('div', { id: 'chart-importance', class: 'chart' })),
      h('div', { class: 'card' }, h('h2', {}, 'Contour'), h('div', { class: 'bar' }, 'x', xSel, 'y', ySel), h('div', { id: 'chart-contour', class: 'chart' }))),
    h('div', { class: 'card' }, h('h2', {}, 'Parallel coordinates'), h('p', { class: 'muted' }, 'Drag along an axis to brush: the table shows only the trials inside every brushed range.'), h('div', { id: 'chart-parcoords', class: 'chart' })),
    h('div', { class: 'card' }, h('h2', {}, 'Slices'), h('div', { id: 'chart-slices', class: 'slices' })),
    h('div', { class: 'card' }, h('h2', {}, 'Learning curves'), h('p', { class: 'muted' }, 'Early-stopped trials are drawn dashed in red.'), h('div', { id: 'chart-curves', class: 'chart' })));

  const setFilter = () => {
    V.filter = { state: stateSel.value, param: paramSel.value, min: minIn.value.trim(), max: maxIn.value.trim() };
    tbl.refresh();
  };
  for (const el of [stateSel, paramSel]) el.addEventListener('change', setFilter);
  for (const el of [minIn, maxIn]) el.addEventListener('input', setFilter);
  tbl.refresh();
  mark('table');

  // ---- summary numbers
  // Counts and best value come from the rows themselves, so a live change shows at once.
  function drawStats(s) {
    const c = { requested: 0, active: 0, stopping: 0, completed: 0, infeasible: 0, failed: 0 };
    for (const st of T.states) c[st] += 1;
    const best = bestOf(metric);
    stats.replaceChildren(
      stat('best ' + metric, best ? fmt(best.value) : '–', 'best-value'),
      stat('best trial', best ? h('a', { href: `/studies/${study}/trials/${best.trial}` }, '#' + best.trial) : '–', 'best-trial'),
      stat('completed', c.completed, 'count-completed'),
      stat('running', c.requested + c.active + c.stopping, 'count-running'),
      stat('failed / infeasible', `${c.failed} / ${c.infeasible}`, 'count-failed'),
      stat('budget', s.spec.max_trials, 'budget'));
  }
  const stat = (k, v, id) => h('div', { class: 'stat' }, h('div', { class: 'v', id }, v), h('div', { class: 'k' }, k));
  function bestOf(m) {
    const col = T.values[m];
    const max = goals[m] === 'maximize';
    let best = null;
    for (let i = 0; i < T.ids.length; i++) {
      const v = col[i];
      if (v == null || T.states[i] !== 'completed') continue;
      if (!best || (max ? v > best.value : v < best.value)) best = { trial: T.ids[i], value: v };
    }
    return best;
  }
  let summary = info;
  drawStats(summary);

  // ---- charts
  let insights = null;
  let histPoints = null; // the server's sample plus live additions
  async function loadInsights() {
    const pending = firstInsights && metric === metrics[0] ? firstInsights : null;
    firstInsights = null;
    insights = await (pending || api(`/v1/studies/${study}/insights?metric=${encodeURIComponent(metric)}`));
    histPoints = { trial: insights.history.trial.slice(), value: insights.history.value.slice() };
    const P = await plotly();
    await drawHistory(P);
    mark('history');
    // One chart per task, so live updates and scrolling get the main thread in between.
    const breath = () => new Promise((r) => setTimeout(r, 0));
    await breath(); drawImportance(P);
    await breath(); drawParcoords(P);
    await breath(); drawSlices(P);
    if (insights.pareto) { await breath(); drawPareto(P); }
    await breath(); await drawContour(P);
    await breath(); await drawCurves(P);
    mark('charts');
  }

  function historyTraces() {
    const max = goals[metric] === 'maximize';
    // Best-so-far from the full columns: exact even when the points are a sample.
    const done = [];
    let ordered = true;
    for (let i = 0; i < T.ids.length; i++) {
      const v = T.values[metric][i];
      if (v != null && T.states[i] === 'completed') {
        if (done.length && done[done.length - 1][0] > T.ids[i]) ordered = false;
        done.push([T.ids[i], v]);
      }
    }
    if (!ordered) done.sort((a, b) => a[0] - b[0]);
    const bx = []; const by = [];
    let best = null;
    for (const [id, v] of done) {
      if (best == null || (max ? v > best : v < best)) { best = v; bx.push(id); by.push(v); }
    }
    if (bx.length) { bx.push(T.ids.reduce((a, b) => (a > b ? a : b), 0)); by.push(best); }
    return [
      { x: histPoints.trial, y: histPoints.value, mode: 'markers', type: 'scatter', name: metric, marker: { size: 5, color: '#7a8bb0', opacity: 0.7 }, hovertemplate: 'trial %{x}<br>%{y}<extra></extra>' },
      { x: bx, y: by, mode: 'lines', type: 'scatter', name: 'best so far', line: { shape: 'hv', color: '#d6452d', width: 2 } },
    ];
  }
  async function drawHistory(P) {
    const note = insights.history.sampled ? ` (${histPoints.trial.length} of ${insights.completed} trials shown)` : '';
    await P.react('chart-history', historyTraces(), baseLayout({ xaxis: { title: { text: 'trial' + note } }, yaxis: { title: { text: metric } } }), PLOT_CONFIG);
  }
  function drawImportance(P) {
    const imp = insights.importance.slice().reverse();
    P.react('chart-importance', [{ type: 'bar', orientation: 'h', y: imp.map((i) => i.parameter), x: imp.map((i) => i.importance), marker: { color: '#2f6fde' } }],
      baseLayout({ margin: { l: 110, r: 16, t: 8, b: 40 }, xaxis: { title: { text: `share of importance (${insights.completed} trials)` }, range: [0, 1] } }), PLOT_CONFIG);
  }
  function dimension(p, values) {
    const a = axes[p];
    const d = { label: p, values: values.map((v) => (v == null ? NaN : v)) };
    if (a.categories.length) { d.tickvals = a.categories.map((_, i) => i); d.ticktext = a.categories; d.range = [0, Math.max(1, a.categories.length - 1)]; }
    else if (a.log) { d.values = d.values.map((v) => Math.log10(v)); d.label = `log10 ${p}`; d.range = [Math.log10(a.min), Math.log10(a.max)]; }
    else if (a.min != null && a.max != null) d.range = [a.min, a.max];
    return d;
  }
  function drawParcoords(P) {
    const s = insights.sample;
    const dims = params.map((p) => dimension(p, s.params[p]));
    dims.push({ label: metric, values: s.value });
    const el = $('#chart-parcoords');
    P.react(el, [{ type: 'parcoords', line: { color: s.value, colorscale: 'Viridis', showscale: true, reversescale: goals[metric] !== 'maximize' }, dimensions: dims }],
      baseLayout({ margin: { l: 60, r: 60, t: 40, b: 20 }, height: 360 }), PLOT_CONFIG);
    if (!el.dataset.hooked) {
      el.dataset.hooked = '1';
      // Brushing narrows the table to the trials inside every brushed range.
      el.on('plotly_restyle', () => {
        const ranges = [];
        (el.data[0].dimensions || []).forEach((d, j) => { if (d.constraintrange) ranges.push([j, d.constraintrange]); });
        if (!ranges.length) { V.brush = null; tbl.refresh(); return; }
        V.brush = (i) => ranges.every(([j, cr]) => {
          let v;
          if (j === params.length) v = T.values[metric][i];
          else { const p = params[j]; const a = axes[p]; v = T.params[p][i]; if (a.categories.length) v = a.categories.indexOf(v); else if (a.log && v != null) v = Math.log10(v); }
          if (v == null || Number.isNaN(v)) return false;
          const list = Array.isArray(cr[0]) ? cr : [cr];
          return list.some(([lo, hi]) => v >= lo && v <= hi);
        });
        tbl.refresh();
      });
    }
  }
  function drawSlices(P) {
    const box = $('#chart-slices');
    if (box.children.length !== params.length) box.replaceChildren(...params.map((p) => h('div', { class: 'chart', id: 'slice-' + p })));
    const s = insights.sample;
    for (const p of params) {
      const a = axes[p];
      const xaxis = { title: { text: p } };
      if (a.log) xaxis.type = 'log';
      if (a.categories.length) { xaxis.tickvals = a.categories.map((_, i) => i); xaxis.ticktext = a.categories; }
      P.react('slice-' + p, [{ x: s.params[p], y: s.value, mode: 'markers', type: 'scatter', marker: { size: 5, color: s.trial, colorscale: 'Blues', opacity: 0.8 }, hovertemplate: `${p} %{x}<br>${metric} %{y}<extra></extra>` }],
        baseLayout({ height: 240, xaxis, yaxis: { title: { text: metric } } }), PLOT_CONFIG);
    }
  }
  function drawPareto(P) {
    const pv = insights.pareto;
    P.react('chart-pareto', [
      { x: pv.x, y: pv.y, mode: 'markers', type: 'scatter', marker: { size: 5, color: '#9aa6c2' }, text: pv.trial, hovertemplate: 'trial %{text}<extra></extra>' },
      { x: pv.front_x, y: pv.front_y, mode: 'lines+markers', type: 'scatter', line: { color: '#d6452d', shape: 'hv' }, marker: { size: 7 }, text: pv.front_trial, hovertemplate: 'trial %{text} (Pareto)<extra></extra>' },
    ], baseLayout({ xaxis: { title: { text: pv.metrics[0].id } }, yaxis: { title: { text: pv.metrics[1].id } } }), PLOT_CONFIG);
  }
  async function drawContour(P) {
    if (params.length < 2) { $('#chart-contour').replaceChildren(h('p', { class: 'muted' }, 'Needs two parameters.')); return; }
    const c = await api(`/v1/studies/${study}/contour?x=${encodeURIComponent(xSel.value)}&y=${encodeURIComponent(ySel.value)}&metric=${encodeURIComponent(metric)}`);
    const ax = (a) => {
      const o = { title: { text: a.id } };
      if (a.log) o.type = 'log';
      if (a.categories.length) { o.tickvals = a.categories.map((_, i) => i); o.ticktext = a.categories; }
      return o;
    };
    P.react('chart-contour', [
      { type: 'contour', x: c.grid.x, y: c.grid.y, z: c.grid.z, connectgaps: true, colorscale: 'Viridis', reversescale: goals[metric] !== 'maximize', colorbar: { title: { text: metric } } },
      { type: 'scatter', mode: 'markers', x: c.points_x, y: c.points_y, marker: { size: 3, color: 'rgba(255,255,255,0.6)' }, hoverinfo: 'skip' },
    ], baseLayout({ xaxis: ax(c.x_axis), yaxis: ax(c.y_axis) }), PLOT_CONFIG);
  }
  async function drawCurves(P) {
    const lc = await api(`/v1/studies/${study}/curves?metric=${encodeURIComponent(metric)}`);
    if (!lc.curves.length) { $('#chart-curves').replaceChildren(h('p', { class: 'muted' }, 'No intermediate values reported yet.')); return; }
    P.react('chart-curves', lc.curves.map((c) => ({
      x: c.step, y: c.value, mode: 'lines', type: 'scatter', name: 'trial ' + c.trial,
      line: c.early_stopped ? { color: '#d64545', dash: 'dash', width: 1.5 } : { color: 'rgba(47,111,222,0.55)', width: 1.2 },
      hovertemplate: `trial ${c.trial}${c.early_stopped ? ' (stopped early)' : ''}<br>step %{x}: %{y}<extra></extra>`,
    })), baseLayout({ xaxis: { title: { text: 'step' } }, yaxis: { title: { text: metric } } }), PLOT_CONFIG);
  }
  xSel.addEventListener('change', () => plotly().then(drawContour).catch(showError));
  ySel.addEventListener('change', () => plotly().then(drawContour).catch(showError));
  metricSel.addEventListener('change', () => { metric = metricSel.value; drawStats(summary); loadInsights().catch(showError); });
  loadInsights().catch(showError);

  // ---- live updates: follow the change cursor, never reload every trial
  let lastInsights = performance.now();
  let dirty = false;
  async function poll() {
    for (;;) {
      let changed = [];
      try {
        for (let page = 0; page < 50; page++) { // bounded catch-up per round
          const r = await api(`/v1/studies/${study}/changes?after=${encodeURIComponent(cursor)}&page_size=1000`);
          cursor = r.cursor;
          changed = changed.concat(r.trials);
          if (!r.has_more) break;
        }
      } catch (e) { /* the server may be restarting: try again next round */ }
      if (changed.length) {
        for (const t of changed) {
          let row = T.index.get(t.id);
          if (row == null) {
            row = T.ids.length;
            T.index.set(t.id, row);
          }
          setRow(row, t, metrics, params);
          if (histPoints && t.state === 'completed' && t.final_measurement && t.final_measurement.metrics[metric] != null && !histPoints.trial.includes(t.id)) {
            histPoints.trial.push(t.id);
            histPoints.value.push(t.final_measurement.metrics[metric]);
          }
        }
        tbl.refresh();
        drawStats(summary);
        window.augur.updates += 1;
        window.augur.lastUpdate = { trials: changed.map((t) => t.id), at: performance.now() };
        if (insights && window.Plotly) await drawHistory(window.Plotly);
        dirty = true;
      }
      if (dirty && insights && performance.now() - lastInsights > INSIGHTS_EVERY_MS) {
        dirty = false;
        lastInsights = performance.now();
        loadInsights().catch(showError);
      }
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  }
  poll();
}

// ---------------------------------------------------------------- trial page
async function trialPage() {
  const study = Number(document.body.dataset.study);
  const trialId = Number(document.body.dataset.trial);
  const [info, t] = await Promise.all([api(`/v1/studies/${study}`), api(`/v1/studies/${study}/trials/${trialId}`)]);
  document.title = `Trial ${trialId} · ${info.name} · Augur`;
  const rows = (pairs) => h('table', { class: 'plain' }, h('tbody', {}, pairs.map(([k, v]) => h('tr', {}, h('th', {}, k), h('td', {}, v)))));
  const job = info.spec.trial_job;
  const dir = job && job.output_dir ? `${job.output_dir}/${trialId}` : null;
  const metrics = info.spec.metrics.map((m) => m.id);
  const fm = t.final_measurement ? t.final_measurement.metrics : {};
  $('#main').replaceChildren(
    h('h1', {}, h('a', { href: `/studies/${study}` }, info.name), ` › trial ${trialId} `, stateBadge(t.state), t.early_stopped ? h('span', { class: 'muted' }, ' stopped early') : null),
    h('div', { class: 'grid2' },
      h('div', { class: 'card' }, h('h2', {}, 'Parameters'), h('div', { id: 'trial-params' }, rows(Object.entries(t.parameters).map(([k, v]) => [k, fmt(v)])))),
      h('div', { class: 'card' }, h('h2', {}, 'Outcome'), h('div', { id: 'trial-outcome' }, rows([
        ...metrics.map((m) => [m, fmt(fm[m])]),
        ['state', t.state], ['client', t.client_id || ''],
        ['created', new Date(t.created_at).toLocaleString()],
        ['started', t.started_at ? new Date(t.started_at).toLocaleString() : ''],
        ['completed', t.completed_at ? new Date(t.completed_at).toLocaleString() : ''],
        ...(t.infeasible_reason ? [['infeasible', t.infeasible_reason]] : []),
        ...(t.fail_reason ? [['failure', t.fail_reason]] : []),
        ...(t.excluded ? [['excluded', 'hidden from the optimizer']] : []),
      ])))),
    h('div', { class: 'card' }, h('h2', {}, 'Learning curve'), h('div', { id: 'chart-trial-curve', class: 'chart' })),
    h('div', { class: 'grid2' },
      h('div', { class: 'card' }, h('h2', {}, 'Model directory'), h('div', { class: 'placeholder', id: 'model-dir' },
        dir ? `${dir}/model (checkpoints in ${dir}/checkpoints)` : 'Shown here once the study dispatches its trials (trial_job.output_dir).')),
      h('div', { class: 'card' }, h('h2', {}, 'Logs'), h('div', { class: 'placeholder', id: 'logs' },
        dir ? `${dir}/logs` : 'stdout and stderr appear here once the study dispatches its trials.'))));
  mark('trial');
  if (job) {
    // Dispatched trials keep stdout/stderr on the server: show the tail.
    fetch(`/v1/studies/${study}/trials/${trialId}/logs?tail_bytes=65536`, { credentials: 'same-origin' })
      .then((r) => (r.ok ? r.text() : null))
      .then((log) => { if (log != null) $('#logs').replaceChildren(h('pre', { class: 'log' }, log || '(empty so far)')); })
      .catch(() => {});
  }
  if (!t.measurements.length) { $('#chart-trial-curve').replaceChildren(h('p', { class: 'muted' }, 'No intermediate values reported.')); return; }
  const P = await plotly();
  await P.react('chart-trial-curve', metrics.map((m) => ({
    x: t.measurements.filter((x) => x.metrics[m] != null).map((x) => x.step),
    y: t.measurements.filter((x) => x.metrics[m] != null).map((x) => x.metrics[m]),
    mode: 'lines+markers', type: 'scatter', name: m,
  })), baseLayout({ showlegend: metrics.length > 1, xaxis: { title: { text: 'step' } } }), PLOT_CONFIG);
  mark('charts');
}

// ---------------------------------------------------------------- compare page
async function comparePage() {
  const ids = (new URLSearchParams(location.search).get('studies') || '').split(',').map((s) => s.trim()).filter((s) => /^\d+$/.test(s)).slice(0, 12);
  const input = h('input', { id: 'compare-ids', placeholder: 'study ids, e.g. 1,2', value: ids.join(',') });
  const form = h('form', { class: 'bar', onsubmit: (e) => { e.preventDefault(); location.href = '/compare?studies=' + encodeURIComponent(input.value.replace(/\s+/g, '')); } },
    'Studies', input, h('button', { type: 'submit' }, 'Compare'));
  $('#main').replaceChildren(h('h1', {}, 'Compare studies'), h('div', { class: 'card' }, form));
  if (ids.length === 0) { $('#main').append(h('p', { class: 'muted' }, 'Name two or more studies to compare.')); return; }
  const data = await Promise.all(ids.map(async (id) => {
    const [s, ins] = await Promise.all([api(`/v1/studies/${id}`), api(`/v1/studies/${id}/insights`)]);
    return { s, ins };
  }));
  const paramNames = [...new Set(data.flatMap((d) => d.ins.parameters.map((p) => p.id)))];
  const bestParams = await Promise.all(data.map((d) => (d.ins.best ? api(`/v1/studies/${d.s.id}/trials/${d.ins.best.trial}`).then((t) => t.parameters) : Promise.resolve({}))));
  $('#main').append(
    h('div', { class: 'card' }, h('h2', {}, 'Best so far'), h('div', { id: 'chart-compare', class: 'chart' })),
    h('div', { class: 'card' }, h('h2', {}, 'Best trials'), h('table', { class: 'plain', id: 'compare-table' },
      h('thead', {}, h('tr', {}, ['study', 'metric', 'best value', 'trial', 'completed', ...paramNames].map((c) => h('th', {}, c)))),
      h('tbody', {}, data.map((d, k) => h('tr', { 'data-study': d.s.id },
        h('td', {}, h('a', { href: '/studies/' + d.s.id }, `#${d.s.id} ${d.s.name}`)),
        h('td', {}, `${d.ins.metric.id} (${d.ins.metric.goal})`),
        h('td', { class: 'best' }, d.ins.best ? fmt(d.ins.best.value) : '–'),
        h('td', {}, d.ins.best ? h('a', { href: `/studies/${d.s.id}/trials/${d.ins.best.trial}` }, '#' + d.ins.best.trial) : '–'),
        h('td', {}, d.ins.completed),
        paramNames.map((p) => h('td', {}, fmt(bestParams[k][p])))))))));
  mark('compare');
  const P = await plotly();
  await P.react('chart-compare', data.map((d) => {
    const hi = d.ins.history;
    const x = hi.best_trial.slice(); const y = hi.best_value.slice();
    if (x.length) { x.push(hi.last_trial); y.push(y[y.length - 1]); }
    return { x, y, mode: 'lines', type: 'scatter', line: { shape: 'hv', width: 2 }, name: `#${d.s.id} ${d.s.name} (${d.ins.metric.id})` };
  }), baseLayout({ showlegend: true, legend: { orientation: 'h', y: -0.2 }, xaxis: { title: { text: 'trial' } }, yaxis: { title: { text: 'best so far' } } }), PLOT_CONFIG);
  mark('charts');
}

const pages = { studies: studiesPage, study: studyPage, trial: trialPage, compare: comparePage };
document.addEventListener('DOMContentLoaded', () => {
  const page = pages[document.body.dataset.page];
  if (page) page().catch(showError);
});
