// The study page (`/studies/{study}`), live while trials run: summary numbers first, then the
// trial table (every trial as columns, from one request), then the charts; afterwards it
// follows the study's change cursor and merges what changed, never reloading every trial.

import { annotationEditor } from './annotations.js';
import { api } from './api.js';
import { logScaleToggle, plotly } from './charts.js';
import { exportTrialsCsv } from './csv.js';
import { $, fmt, h, showError, stateBadge } from './dom.js';
import { followChanges } from './live.js';
import { mark, noteLiveUpdate } from './marks.js';
import { StudyCharts } from './study-charts.js';
import { TableView, TrialColumns, trialTable } from './table.js';

/** The heavy charts refresh at most this often while trials change. */
const INSIGHTS_EVERY_MS = 15000;
const TABLE_STATES = ['', 'requested', 'active', 'stopping', 'paused', 'completed', 'infeasible', 'failed'];

export async function studyPage() {
  const study = Number(document.body.dataset.study);
  // Everything is asked for at once. The study's numbers come first (two indexed queries), so
  // the page says something useful while the table is on its way; the server loads the trials
  // once for both the table and the insights.
  const tableRequest = api(`/v1/studies/${study}/table`);
  const firstInsights = api(`/v1/studies/${study}/insights`);
  firstInsights.catch(() => {});
  plotly().catch(() => {});
  const info = await api(`/v1/studies/${study}`);
  drawSummary(study, info);
  mark('summary');

  const page = studyState(study, info, await tableRequest);
  const table = trialTable(study, page.columns, page.view);
  const controls = studyControls(page);
  $('#main').replaceChildren(...studyLayout(page, controls, table));
  filterTableBy(controls, page.view, table);
  table.refresh();
  mark('table');
  drawStats(page, controls.stats);

  const charts = new StudyCharts(page, {
    contour: [controls.contourX, controls.contourY],
    firstInsights,
    onBrush: (keep) => { page.view.brush = keep; table.refresh(); },
  });
  for (const select of [controls.contourX, controls.contourY]) {
    select.addEventListener('change', () => charts.redrawContour().catch(showError));
  }
  controls.metric.addEventListener('change', () => {
    page.metric = controls.metric.value;
    drawStats(page, controls.stats);
    charts.load().catch(showError);
  });
  charts.load().catch(showError);
  followStudy(page, table, charts, controls.stats);
}

/** The first paint: name, state, best value and counts, from the study alone. */
function drawSummary(study, info) {
  document.title = `${info.name} · Augur`;
  const counts = info.trial_counts;
  const metric = info.spec.metrics[0].id;
  const best = info.best_trial && info.best_trial.final_measurement ? info.best_trial.final_measurement.metrics[metric] : null;
  $('#main').replaceChildren(
    studyHeading(study, info),
    h('div', { class: 'card' }, h('div', { class: 'stats', id: 'stats' },
      stat('best ' + metric, best == null ? '–' : fmt(best), 'best-value'),
      stat('completed', counts.completed),
      stat('trials', counts.total))),
    h('p', { class: 'muted' }, 'Loading trials…'));
}

const studyHeading = (study, info) => h('h1', {}, info.name, ' ', stateBadge(info.state), ' ',
  h('span', { class: 'muted' }, `#${study} · ${info.spec.algorithm}`),
  ...warmStart(info.spec.prior_studies || []));

/** A warm-started study names the studies it learns from, each a link. */
const warmStart = (priors) => (priors.length ? [h('span', { class: 'muted', id: 'warm-start' }, ' · warm-started from ',
  ...priors.flatMap((id, i) => [i ? ', ' : '', h('a', { href: `/studies/${id}` }, `#${id}`)]))] : []);

const stat = (label, value, id) => h('div', { class: 'stat' }, h('div', { class: 'v', id }, value), h('div', { class: 'k' }, label));

/** What the page's parts share, from the study and its table. */
function studyState(study, info, table) {
  const columns = new TrialColumns(table);
  return {
    study,
    /** The study as `GET /v1/studies/{study}` gave it. */
    info,
    columns,
    view: new TableView(),
    /** Metric id → `minimize` or `maximize`. */
    goals: Object.fromEntries(table.metrics.map((m) => [m.id, m.goal])),
    /** Parameter id → its axis: `categories`, `log`, `min`, `max`. */
    axes: Object.fromEntries(table.parameters.map((p) => [p.id, p])),
    /** The metric the numbers and charts show (the select above them). */
    metric: columns.metrics[0],
    /** The change cursor the table was read at. */
    cursor: table.cursor,
  };
}

/** The page's inputs: metric, table filters, contour axes; and the stats' container. */
function studyControls(page) {
  const { columns, goals, axes } = page;
  const params = columns.parameters;
  const options = (values) => values.map((v) => h('option', { value: v }, v));
  const controls = {
    stats: h('div', { class: 'stats', id: 'stats' }),
    metric: h('select', { id: 'metric' }, columns.metrics.map((m) => h('option', { value: m }, `${m} (${goals[m]})`))),
    state: h('select', { id: 'table-state' }, TABLE_STATES.map((s) => h('option', { value: s }, s || 'any state'))),
    // Ranges apply to numeric parameters only.
    param: h('select', { id: 'table-param' }, h('option', { value: '' }, 'parameter…'), options(params.filter((p) => !axes[p].categories.length)),
      numericAttrs(columns).map((a) => h('option', { value: 'u:' + a }, a + ' (user attribute)'))),
    tag: h('select', { id: 'table-tag' }, h('option', { value: '' }, 'any tag'), options(columns.allTags())),
    min: h('input', { id: 'table-min', class: 'num', placeholder: 'min', inputmode: 'decimal' }),
    max: h('input', { id: 'table-max', class: 'num', placeholder: 'max', inputmode: 'decimal' }),
    contourX: h('select', { id: 'contour-x' }, options(params)),
    contourY: h('select', { id: 'contour-y' }, options(params)),
  };
  if (params.length > 1) controls.contourY.value = params[1];
  return controls;
}

/** Every card of the page, top to bottom. */
function studyLayout(page, controls, table) {
  const { study, info, columns } = page;
  const metrics = columns.metrics;
  const multi = metrics.length > 1;
  const card = (title, ...body) => h('div', { class: 'card' }, h('h2', {}, title), ...body);
  const chart = (id) => h('div', { id, class: 'chart' });
  const note = (text) => h('p', { class: 'muted' }, text);
  return [
    studyHeading(study, info),
    h('details', { class: 'card', id: 'study-annotations', open: info.note || (info.tags || []).length ? true : null },
      h('summary', {}, 'Note and tags', ...(info.tags || []).map((t) => [' ', h('span', { class: 'tag' }, t)])),
      annotationEditor(`/v1/studies/${study}`, info, 'study')),
    h('div', { class: 'card' }, h('div', { class: 'bar' }, h('span', { class: 'live', title: 'live' }), 'Metric', controls.metric,
      h('a', { href: `/compare?studies=${study}` }, 'compare…')), controls.stats),
    h('div', { class: multi ? 'grid2' : '' },
      card('Optimization history', h('div', { class: 'bar' }, logScaleToggle('chart-history')), chart('chart-history')),
      multi ? card(`Pareto front (${metrics[0]} vs ${metrics[1]})`, chart('chart-pareto')) : null),
    card('Trials',
      h('div', { class: 'bar' }, controls.state, controls.tag, controls.param, controls.min, controls.max,
        h('button', { id: 'export-csv', class: 'secondary', onclick: () => exportTrialsCsv(study, columns, page.view) }, 'Export CSV'),
        table.count),
      table.el),
    h('div', { class: 'grid2' },
      card('Parameter importance (PED-ANOVA)', chart('chart-importance')),
      card('Contour', h('div', { class: 'bar' }, 'x', controls.contourX, 'y', controls.contourY), chart('chart-contour'))),
    card('Parallel coordinates', note('Drag along an axis to brush: the table shows only the trials inside every brushed range.'), chart('chart-parcoords')),
    card('Slices', h('div', { id: 'chart-slices', class: 'slices' })),
    card('Learning curves', h('div', { class: 'bar' }, note('Early-stopped trials are drawn dashed in red.'), logScaleToggle('chart-curves')), chart('chart-curves')),
    info.spec.scheduler ? card('Rungs', note('The metric at each budget a trial reached, one line per trial: a dot where it went on, a red × where the scheduler stopped it, a hollow circle where it waits.'), chart('chart-rungs')) : null,
  ];
}

/** User attributes that hold numbers in some trial and nothing but numbers: rangeable. */
const numericAttrs = (columns) => columns.attrNames.filter((a) => {
  const values = columns.userAttrs[a].filter((v) => v != null);
  return values.length && values.every((v) => typeof v === 'number');
});

/** The table's state, tag and range filters follow their inputs. */
function filterTableBy(controls, view, table) {
  const apply = () => {
    view.filter = { state: controls.state.value, tag: controls.tag.value, param: controls.param.value, min: controls.min.value.trim(), max: controls.max.value.trim() };
    table.refresh();
  };
  for (const el of [controls.state, controls.tag, controls.param]) el.addEventListener('change', apply);
  for (const el of [controls.min, controls.max]) el.addEventListener('input', apply);
}

/** Best value and trial, counts by state and budget, from the columns: live changes show at once. */
function drawStats(page, container) {
  const { study, info, columns, goals, metric } = page;
  const counts = columns.countStates();
  const best = columns.best(metric, goals[metric] === 'maximize');
  container.replaceChildren(
    stat('best ' + metric, best ? fmt(best.value) : '–', 'best-value'),
    stat('best trial', best ? h('a', { href: `/studies/${study}/trials/${best.trial}` }, '#' + best.trial) : '–', 'best-trial'),
    stat('completed', counts.completed, 'count-completed'),
    stat('running', counts.requested + counts.active + counts.stopping, 'count-running'),
    ...(counts.paused ? [stat('paused at a rung', counts.paused, 'count-paused')] : []),
    stat('failed / infeasible', `${counts.failed} / ${counts.infeasible}`, 'count-failed'),
    stat('budget', info.spec.max_trials, 'budget'));
}

/** Merges live changes into the table, numbers and history; the other charts refresh at most every INSIGHTS_EVERY_MS. */
function followStudy(page, table, charts, statsContainer) {
  let chartsLoadedAt = performance.now();
  let chartsStale = false;
  followChanges({
    study: page.study,
    cursor: page.cursor,
    async onChanges(trials) {
      for (const trial of trials) {
        page.columns.upsert(trial);
        charts.addToHistory(trial);
      }
      table.refresh();
      drawStats(page, statsContainer);
      noteLiveUpdate(trials.map((t) => t.id));
      await charts.redrawHistory();
      chartsStale = true;
    },
    onRound() {
      if (chartsStale && charts.insights && performance.now() - chartsLoadedAt > INSIGHTS_EVERY_MS) {
        chartsStale = false;
        chartsLoadedAt = performance.now();
        charts.load().catch(showError);
      }
    },
  });
}
