// The study page's charts, drawn from the server's aggregates (`/v1/studies/{study}/insights`,
// `…/contour`, `…/curves`) and the page's trial columns: optimization history, parameter
// importance, parallel coordinates (whose brush filters the trial table), slices, the Pareto
// front of two metrics, a contour of two parameters and learning curves.

import { api } from './api.js';
import { PLOT_CONFIG, baseLayout, categoryTicks, plotText, plotly, titled, yScale } from './charts.js';
import { $, h, nextTask } from './dom.js';
import { mark } from './marks.js';

/** The charts drawn from completed trials only: each says so while there are none. */
const CHARTS_OF_COMPLETED_TRIALS = ['chart-history', 'chart-importance', 'chart-parcoords', 'chart-slices', 'chart-contour'];

/** Clears chart `id` and puts `text` in its place. */
function emptyChart(P, id, text) {
  const el = $('#' + id);
  if (el.classList.contains('js-plotly-plot')) P.purge(el);
  delete el.dataset.hooked;
  el.replaceChildren(h('p', { class: 'muted empty-chart' }, text));
}

/** Takes away what `emptyChart` put in chart `id`, before it is drawn. */
function unemptyChart(id) {
  const el = $('#' + id);
  if (el.querySelector(':scope > .empty-chart')) el.replaceChildren();
}

export class StudyCharts {
  /**
   * `page` is the study page's shared state (study, columns, goals, axes, metric); `contour`
   * the two selects naming its axes; `onBrush(predicate | null)` receives the rows the
   * parallel coordinates' brush keeps; `firstInsights` the insights already asked for.
   */
  constructor(page, { contour, onBrush, firstInsights }) {
    this.page = page;
    this.contour = contour;
    this.onBrush = onBrush;
    this.firstInsights = firstInsights;
    /** The latest insights, for `page.metric`; null until they come. */
    this.insights = null;
    /** The history's points: the server's sample plus trials completed since. */
    this.historyPoints = null;
  }

  /** Fetches the insights for the page's metric and draws every chart, history first. */
  async load() {
    const { study, columns, metric } = this.page;
    const pending = this.firstInsights && metric === columns.metrics[0] ? this.firstInsights : null;
    this.firstInsights = null;
    const insights = await (pending || api(`/v1/studies/${study}/insights?metric=${encodeURIComponent(metric)}`));
    this.insights = insights;
    this.historyPoints = { trial: insights.history.trial.slice(), value: insights.history.value.slice() };
    const P = await plotly();
    if (insights.completed === 0) {
      // Empty axes (−1..6) would say nothing, or suggest a broken chart: say why instead.
      const failed = this.page.columns.states.filter((s) => s === 'failed' || s === 'infeasible').length;
      const why = failed ? `No trial has completed with ${metric} yet: ${failed} failed or infeasible (see the table for their reasons).` : `No trial has completed with ${metric} yet.`;
      for (const id of CHARTS_OF_COMPLETED_TRIALS) emptyChart(P, id, why);
      mark('history');
      await nextTask(); await this.drawCurves(P);
      mark('charts');
      return;
    }
    for (const id of CHARTS_OF_COMPLETED_TRIALS) unemptyChart(id);
    await this.drawHistory(P);
    mark('history');
    // One chart per task, so live updates and scrolling get the main thread in between.
    await nextTask(); drawImportance(P, insights);
    await nextTask(); this.drawParcoords(P);
    await nextTask(); this.drawSlices(P);
    if (insights.pareto) { await nextTask(); drawPareto(P, insights.pareto); }
    await nextTask(); await this.drawContour(P);
    await nextTask(); await this.drawCurves(P);
    mark('charts');
  }

  /** Adds a trial that changed live to the history's points, once it completed. */
  addToHistory(trial) {
    const points = this.historyPoints;
    const value = trial.final_measurement ? trial.final_measurement.metrics[this.page.metric] : null;
    if (points && trial.state === 'completed' && value != null && !points.trial.includes(trial.id)) {
      points.trial.push(trial.id);
      points.value.push(value);
    }
  }

  /** Redraws the history after live changes, once plotly.js and the insights are there. */
  async redrawHistory() {
    if (this.insights && window.Plotly) await this.drawHistory(window.Plotly);
  }

  /** Redraws the contour for the axes now selected. */
  redrawContour() {
    return plotly().then((P) => this.drawContour(P));
  }

  async drawHistory(P) {
    const { columns, goals, metric } = this.page;
    const points = this.historyPoints;
    const best = columns.bestSoFar(metric, goals[metric] === 'maximize');
    const note = this.insights.history.sampled ? ` (${points.trial.length} of ${this.insights.completed} trials shown)` : '';
    await P.react('chart-history', [
      { x: points.trial, y: points.value, mode: 'markers', type: 'scatter', name: plotText(metric), marker: { size: 5, color: '#7a8bb0', opacity: 0.7 }, hovertemplate: 'trial %{x}<br>%{y}<extra></extra>' },
      { x: best.x, y: best.y, mode: 'lines', type: 'scatter', name: 'best so far', line: { shape: 'hv', color: '#d6452d', width: 2 } },
    ], baseLayout({ xaxis: titled('trial' + note), yaxis: { ...titled(metric), type: yScale('chart-history') } }), PLOT_CONFIG);
  }

  /**
   * One axis per parameter, as the server placed it (categories at 0, 1, …; log scales as
   * log10; inactive values of a conditional parameter on a tick of their own), and the metric.
   */
  parcoordsDimension(parallel) {
    const axis = this.page.axes[parallel.parameter];
    const label = axis.log && !axis.categories.length ? `log10 ${plotText(parallel.parameter)}` : plotText(parallel.parameter);
    const d = { label, values: parallel.values, range: parallel.range };
    // Tick labels of parallel coordinates are plain SVG text (d3), not Plotly's HTML subset:
    // the categories go in as they are, where escaping would show "&lt;". The label is HTML.
    if (parallel.tickvals.length) Object.assign(d, { tickvals: parallel.tickvals, ticktext: parallel.ticktext });
    return d;
  }

  drawParcoords(P) {
    const { columns, goals, metric } = this.page;
    const sample = this.insights.sample;
    const dimensions = sample.parallel.map((axis) => this.parcoordsDimension(axis));
    dimensions.push({ label: plotText(metric), values: sample.value });
    const el = $('#chart-parcoords');
    P.react(el, [{ type: 'parcoords', line: { color: sample.value, colorscale: 'Viridis', showscale: true, reversescale: goals[metric] !== 'maximize' }, dimensions }],
      baseLayout({ margin: { l: 60, r: 60, t: 40, b: 20 }, height: 360 }), PLOT_CONFIG);
    if (!el.dataset.hooked) {
      el.dataset.hooked = '1';
      el.on('plotly_restyle', () => this.onBrush(this.brushPredicate(el.data[0].dimensions || [])));
    }
  }

  /** The rows inside every brushed range of the parallel coordinates; null when none is. */
  brushPredicate(dimensions) {
    const { columns, axes } = this.page;
    const ranges = [];
    dimensions.forEach((d, j) => { if (d.constraintrange) ranges.push([j, d.constraintrange]); });
    if (!ranges.length) return null;
    const params = columns.parameters;
    // Brushing the "inactive" tick keeps the trials that lack the parameter.
    const inactiveAt = params.map((p) => {
      const axis = this.insights.sample.parallel.find((a) => a.parameter === p);
      return axis && axis.inactive_at != null ? axis.inactive_at : null;
    });
    // Read at brush time: the metric may have changed since the chart was drawn.
    const metric = this.page.metric;
    const axisValue = (j, row) => {
      if (j === params.length) return columns.values[metric][row];
      const p = params[j];
      const axis = axes[p];
      const v = columns.params[p][row];
      if (v == null) return inactiveAt[j];
      if (axis.categories.length) return axis.categories.indexOf(v);
      return axis.log && v != null ? Math.log10(v) : v;
    };
    return (row) => ranges.every(([j, range]) => {
      const v = axisValue(j, row);
      if (v == null || Number.isNaN(v)) return false;
      const list = Array.isArray(range[0]) ? range : [range];
      return list.some(([lo, hi]) => v >= lo && v <= hi);
    });
  }

  drawSlices(P) {
    const { columns, axes, metric } = this.page;
    const params = columns.parameters;
    const box = $('#chart-slices');
    if (box.children.length !== params.length) box.replaceChildren(...params.map((p) => h('div', { class: 'chart', id: 'slice-' + p })));
    const sample = this.insights.sample;
    for (const p of params) {
      const axis = axes[p];
      const xaxis = titled(p);
      if (axis.log) xaxis.type = 'log';
      if (axis.categories.length) Object.assign(xaxis, categoryTicks(axis.categories));
      P.react('slice-' + p, [{ x: sample.params[p], y: sample.value, mode: 'markers', type: 'scatter', marker: { size: 5, color: sample.trial, colorscale: 'Blues', opacity: 0.8 }, hovertemplate: `${plotText(p)} %{x}<br>${plotText(metric)} %{y}<extra></extra>` }],
        baseLayout({ height: 240, xaxis, yaxis: titled(metric) }), PLOT_CONFIG);
    }
  }

  async drawContour(P) {
    const { study, columns, goals, metric } = this.page;
    if (columns.parameters.length < 2) { $('#chart-contour').replaceChildren(h('p', { class: 'muted' }, 'Needs two parameters.')); return; }
    const [x, y] = this.contour.map((select) => encodeURIComponent(select.value));
    const c = await api(`/v1/studies/${study}/contour?x=${x}&y=${y}&metric=${encodeURIComponent(metric)}`);
    const axis = (a) => {
      const layout = titled(a.id);
      if (a.log) layout.type = 'log';
      if (a.categories.length) Object.assign(layout, categoryTicks(a.categories));
      return layout;
    };
    P.react('chart-contour', [
      { type: 'contour', x: c.grid.x, y: c.grid.y, z: c.grid.z, connectgaps: true, colorscale: 'Viridis', reversescale: goals[metric] !== 'maximize', colorbar: titled(metric) },
      { type: 'scatter', mode: 'markers', x: c.points_x, y: c.points_y, marker: { size: 3, color: 'rgba(255,255,255,0.6)' }, hoverinfo: 'skip' },
    ], baseLayout({ xaxis: axis(c.x_axis), yaxis: axis(c.y_axis) }), PLOT_CONFIG);
  }

  async drawCurves(P) {
    const { study, metric } = this.page;
    const lc = await api(`/v1/studies/${study}/curves?metric=${encodeURIComponent(metric)}`);
    if (!lc.curves.length) { $('#chart-curves').replaceChildren(h('p', { class: 'muted' }, 'No intermediate values reported yet.')); return; }
    P.react('chart-curves', lc.curves.map((c) => ({
      x: c.step, y: c.value, mode: 'lines', type: 'scatter', name: 'trial ' + c.trial,
      line: c.early_stopped ? { color: '#d64545', dash: 'dash', width: 1.5 } : { color: 'rgba(47,111,222,0.55)', width: 1.2 },
      hovertemplate: `trial ${c.trial}${c.early_stopped ? ' (stopped early)' : ''}<br>step %{x}: %{y}<extra></extra>`,
    })), baseLayout({ xaxis: titled('step'), yaxis: { ...titled(metric), type: yScale('chart-curves') } }), PLOT_CONFIG);
    if (lc.rungs) drawRungs(P, lc, metric);
  }
}

/**
 * The rung chart of a multi-fidelity study: each trial's metric at every rung it reached (the
 * latest value at or before the rung's step), with how its climb ended: stopped (red ×),
 * paused (hollow circle) or at the full budget (dot).
 */
function drawRungs(P, lc, metric) {
  const traces = lc.curves.map((c) => {
    const xs = []; const ys = [];
    const reached = c.step[c.step.length - 1];
    for (const rung of lc.rungs) {
      if (reached < Math.round(rung) - 1e-9) break;
      let at = -1;
      for (let i = 0; i < c.step.length && c.step[i] <= rung + 1e-9; i += 1) at = i;
      if (at >= 0) { xs.push(rung); ys.push(c.value[at]); }
    }
    const end = c.state === 'paused' ? 'circle-open' : c.early_stopped ? 'x' : 'circle';
    const symbols = xs.map((_, i) => (i === xs.length - 1 ? end : 'circle'));
    const colors = xs.map((_, i) => (i === xs.length - 1 && c.early_stopped ? '#d64545' : 'rgba(47,111,222,0.8)'));
    return {
      x: xs, y: ys, mode: 'lines+markers', type: 'scatter', name: 'trial ' + c.trial,
      line: { color: 'rgba(47,111,222,0.4)', width: 1.2 }, marker: { symbol: symbols, color: colors, size: 8 },
      hovertemplate: `trial ${c.trial}<br>budget %{x}: %{y}<extra></extra>`,
    };
  });
  P.react('chart-rungs', traces, baseLayout({ showlegend: false, xaxis: { ...titled('budget'), type: 'log', tickvals: lc.rungs }, yaxis: titled(metric) }), PLOT_CONFIG);
}

function drawImportance(P, insights) {
  const importance = insights.importance.slice().reverse();
  P.react('chart-importance', [{ type: 'bar', orientation: 'h', y: importance.map((i) => plotText(i.parameter)), x: importance.map((i) => i.importance), marker: { color: '#2f6fde' } }],
    baseLayout({ margin: { l: 110, r: 16, t: 8, b: 40 }, xaxis: { ...titled(`share of importance (${insights.completed} trials)`), range: [0, 1] } }), PLOT_CONFIG);
}

function drawPareto(P, pareto) {
  P.react('chart-pareto', [
    { x: pareto.x, y: pareto.y, mode: 'markers', type: 'scatter', marker: { size: 5, color: '#9aa6c2' }, text: pareto.trial, hovertemplate: 'trial %{text}<extra></extra>' },
    { x: pareto.front_x, y: pareto.front_y, mode: 'lines+markers', type: 'scatter', line: { color: '#d6452d', shape: 'hv' }, marker: { size: 7 }, text: pareto.front_trial, hovertemplate: 'trial %{text} (Pareto)<extra></extra>' },
  ], baseLayout({ xaxis: titled(pareto.metrics[0].id), yaxis: titled(pareto.metrics[1].id) }), PLOT_CONFIG);
}
