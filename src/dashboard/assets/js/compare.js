// The compare page (`/compare?studies=1,2`): studies side by side, their best-so-far curves on
// one chart and their best trials' parameters in one table.

import { api } from './api.js';
import { PLOT_CONFIG, baseLayout, plotText, plotly, titled } from './charts.js';
import { $, fmt, h } from './dom.js';
import { mark } from './marks.js';

const MAX_STUDIES = 12;

export async function comparePage() {
  const ids = (new URLSearchParams(location.search).get('studies') || '').split(',')
    .map((s) => s.trim()).filter((s) => /^\d+$/.test(s)).slice(0, MAX_STUDIES);
  const input = h('input', { id: 'compare-ids', placeholder: 'study ids, e.g. 1,2', value: ids.join(',') });
  const form = h('form', {
    class: 'bar',
    onsubmit: (e) => { e.preventDefault(); location.href = '/compare?studies=' + encodeURIComponent(input.value.replace(/\s+/g, '')); },
  }, 'Studies', input, h('button', { type: 'submit' }, 'Compare'));
  $('#main').replaceChildren(h('h1', {}, 'Compare studies'), h('div', { class: 'card' }, form));
  if (ids.length === 0) { $('#main').append(h('p', { class: 'muted' }, 'Name two or more studies to compare.')); return; }

  const studies = await Promise.all(ids.map(async (id) => {
    const [info, insights] = await Promise.all([api(`/v1/studies/${id}`), api(`/v1/studies/${id}/insights`)]);
    return { info, insights };
  }));
  const bestParams = await Promise.all(studies.map(({ info, insights }) => (insights.best
    ? api(`/v1/studies/${info.id}/trials/${insights.best.trial}`).then((t) => t.parameters)
    : Promise.resolve({}))));
  $('#main').append(
    h('div', { class: 'card' }, h('h2', {}, 'Best so far'), h('div', { id: 'chart-compare', class: 'chart' })),
    h('div', { class: 'card' }, h('h2', {}, 'Best trials'), bestTrialsTable(studies, bestParams)));
  mark('compare');
  await drawBestSoFar(studies);
  mark('charts');
}

/** One row per study: its metric, best value and trial, and the best trial's parameters. */
function bestTrialsTable(studies, bestParams) {
  const paramNames = [...new Set(studies.flatMap(({ insights }) => insights.parameters.map((p) => p.id)))];
  return h('table', { class: 'plain', id: 'compare-table' },
    h('thead', {}, h('tr', {}, ['study', 'metric', 'best value', 'trial', 'completed', ...paramNames].map((c) => h('th', {}, c)))),
    h('tbody', {}, studies.map(({ info, insights }, k) => h('tr', { 'data-study': info.id },
      h('td', {}, h('a', { href: '/studies/' + info.id }, `#${info.id} ${info.name}`)),
      h('td', {}, `${insights.metric.id} (${insights.metric.goal})`),
      h('td', { class: 'best' }, insights.best ? fmt(insights.best.value) : '–'),
      h('td', {}, insights.best ? h('a', { href: `/studies/${info.id}/trials/${insights.best.trial}` }, '#' + insights.best.trial) : '–'),
      h('td', {}, insights.completed),
      paramNames.map((p) => h('td', {}, fmt(bestParams[k][p])))))));
}

/**
 * Each study's best-so-far steps, carried on to its last trial. Studies that compare the same
 * metric with the same goal share an axis; each other metric and goal gets a chart of its own
 * below (a maximized accuracy and a minimized loss on one axis would read as nonsense).
 */
async function drawBestSoFar(studies) {
  const P = await plotly();
  const groups = [...new Set(studies.map(({ insights }) => axisKey(insights.metric)))];
  const traces = studies.map(({ info, insights }) => {
    const history = insights.history;
    const x = history.best_trial.slice();
    const y = history.best_value.slice();
    if (x.length) { x.push(history.last_trial); y.push(y[y.length - 1]); }
    const k = groups.indexOf(axisKey(insights.metric));
    return {
      x, y, mode: 'lines', type: 'scatter', line: { shape: 'hv', width: 2 },
      xaxis: k ? `x${k + 1}` : 'x', yaxis: k ? `y${k + 1}` : 'y',
      name: plotText(`#${info.id} ${info.name} (${insights.metric.id})`),
    };
  });
  const layout = baseLayout({
    showlegend: true, legend: { orientation: 'h', y: -0.2 / groups.length },
    height: 80 + 260 * groups.length,
    grid: { rows: groups.length, columns: 1, pattern: 'independent', roworder: 'top to bottom' },
  });
  groups.forEach((key, k) => {
    const [id, goal] = JSON.parse(key);
    const suffix = k ? String(k + 1) : '';
    layout['xaxis' + suffix] = titled('trial');
    layout['yaxis' + suffix] = titled(`best ${id} (${goal === 'maximize' ? 'higher' : 'lower'} is better)`);
  });
  await P.react('chart-compare', traces, layout, PLOT_CONFIG);
}

/** Studies whose curves share an axis: same metric id, same goal. */
const axisKey = (metric) => JSON.stringify([metric.id, metric.goal]);
