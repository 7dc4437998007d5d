// The dashboard in headless Chromium against a live server seeded by
// `cargo test --test api dashboard::seed_browser_fixture -- --ignored` (see scripts/browser-test.sh):
// pages show the numbers the API holds, the table filters and sorts, a trial completed through
// the API appears without a reload, and on the 50,000-trial study the first meaningful paint
// and each live update stay under a second; a study named and labelled with spreadsheet
// formulas and HTML exports them neutralised and is drawn with them as plain text.
// Screenshots go to $ARTIFACTS.
//
// usage: node dashboard.mjs <base url> <small study> <two-metric study> <large study> <hostile study>
import { chromium } from 'playwright-core';
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

const [base, SMALL, MULTI, LARGE, HOSTILE, CLUSTER, WARM, FAILED, PBT] = process.argv.slice(2);
const ARTIFACTS = process.env.ARTIFACTS || 'target/browser-artifacts';
// The target is 1 s for each (printed with every run). Timings depend on what else the machine
// runs, so the test fails only past LIMIT_MS (a sanity bound unless set lower).
const TARGET_MS = 1000;
const LIMIT_MS = Number(process.env.AUGUR_BROWSER_LIMIT_MS || 10000);
mkdirSync(ARTIFACTS, { recursive: true });

async function api(method, path, body) {
  const r = await fetch(base + path, {
    method, headers: body ? { 'content-type': 'application/json' } : {}, body: body ? JSON.stringify(body) : undefined,
  });
  const json = await r.json().catch(() => null);
  if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${JSON.stringify(json)}`);
  return json;
}
const get = (p) => api('GET', p);
const post = (p, b) => api('POST', p, b);

function assert(cond, message) { if (!cond) throw new Error('assertion failed: ' + message); }
// Values are shown with 6 significant digits.
const close = (a, b) => Math.abs(a - b) <= 1e-5 * Math.max(1, Math.abs(b));
const num = (s) => Number(String(s).trim());

const results = [];
async function test(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    results.push([name, true]);
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    results.push([name, false]);
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
const context = await browser.newContext({ viewport: { width: 1400, height: 1000 }, acceptDownloads: true });
const page = await context.newPage();
page.on('pageerror', (e) => console.log('page error:', e.message));
const shot = (name) => page.screenshot({ path: join(ARTIFACTS, name), fullPage: true });
const text = (sel) => page.locator(sel).first().innerText();

// Adds a completed trial through the API with the given accuracy; returns its id.
async function addTrial(study, accuracy) {
  const t = await post(`/v1/studies/${study}/trials`, {
    parameters: { lr: 0.01, layers: 3, kernel: 'rbf' }, final_measurement: { metrics: { accuracy } },
  });
  return t.id;
}

await test('studies page lists every study with its best value, and filters by name and state', async () => {
  await page.goto(base + '/');
  await page.waitForSelector('#studies tbody tr');
  const studies = (await get('/v1/studies')).studies;
  assert(await page.locator('#studies tbody tr').count() === studies.length, 'one row per study');
  const s1 = studies.find((s) => String(s.id) === SMALL);
  const best = s1.best_trial.final_measurement.metrics.accuracy;
  const cell = await text(`#studies tr[data-study="${SMALL}"] td.best`);
  assert(close(num(cell.split(' ')[0]), best), `best value ${cell} vs ${best}`);
  await shot('studies.png');
  await page.fill('#filter-name', 'two-met');
  await page.waitForFunction(() => document.querySelectorAll('#studies tbody tr').length === 1);
  assert(page.url().includes('name=two-met'), 'the filter is in the URL');
  await page.fill('#filter-name', '');
  await page.selectOption('#filter-state', 'stopped');
  await page.waitForFunction(() => document.querySelectorAll('#studies tbody tr').length === 0);
});

let bestSmall;
await test('study page shows the best value, filters and sorts the table, draws every chart', async () => {
  const info = await get(`/v1/studies/${SMALL}`);
  bestSmall = info.best_trial;
  await page.goto(`${base}/studies/${SMALL}`);
  await page.waitForFunction(() => window.augur.marks.charts);
  assert(close(num(await text('#best-value')), bestSmall.final_measurement.metrics.accuracy), 'best value');
  assert((await text('#best-trial')) === '#' + bestSmall.id, 'best trial');
  const total = info.trial_counts.total;
  assert((await text('#row-count')) === `${total} of ${total} trials`, 'row count ' + (await text('#row-count')));
  // A range filter on lr keeps exactly the trials the API says are in range.
  let inRange = 0;
  let token = '';
  for (let i = 0; i < 10; i++) {
    const page_ = await get(`/v1/studies/${SMALL}/trials?page_size=1000${token ? '&page_token=' + token : ''}`);
    inRange += page_.trials.filter((t) => t.parameters.lr >= 0.001 && t.parameters.lr <= 0.05).length;
    token = page_.next_page_token;
    if (!token) break;
  }
  await page.selectOption('#table-param', 'lr');
  await page.fill('#table-min', '0.001');
  await page.fill('#table-max', '0.05');
  await page.waitForFunction((n) => document.querySelector('#row-count').textContent.startsWith(n + ' of'), inRange);
  await page.selectOption('#table-state', 'failed');
  await page.waitForFunction(() => document.querySelector('#row-count').textContent.startsWith('0 of'));
  await page.selectOption('#table-state', '');
  await page.fill('#table-min', '');
  await page.fill('#table-max', '');
  // Sorting by the metric (descending first) puts the best trial on top.
  await page.click('.vt-head div[data-key="m:accuracy"]');
  const first = await page.locator('#trial-table .vt-row').first().getAttribute('data-trial');
  assert(first === String(bestSmall.id), `top row ${first} vs best ${bestSmall.id}`);
  // Charts: best-so-far ends at the best value; lr is the most important parameter.
  const hist = await page.evaluate(() => document.getElementById('chart-history').data.map((t) => t.y.length));
  assert(hist[0] === total && hist[1] >= 1, 'history traces ' + hist);
  const lastBest = await page.evaluate(() => { const y = document.getElementById('chart-history').data[1].y; return y[y.length - 1]; });
  assert(close(lastBest, bestSmall.final_measurement.metrics.accuracy), 'best-so-far line ends at the best value');
  const top = await page.evaluate(() => { const d = document.getElementById('chart-importance').data[0]; return d.y[d.y.length - 1]; });
  assert(top === 'lr', 'most important parameter: ' + top);
  for (const id of ['chart-parcoords', 'chart-contour', 'chart-curves', 'slice-lr', 'slice-layers', 'slice-kernel']) {
    const n = await page.evaluate((id) => (document.getElementById(id).data || []).length, id);
    assert(n >= 1, id + ' is drawn');
  }
  // Brushing lr (shown as log10) on the parallel coordinates narrows the table to those trials.
  let brushed = 0;
  token = '';
  for (let i = 0; i < 10; i++) {
    const page_ = await get(`/v1/studies/${SMALL}/trials?page_size=1000${token ? '&page_token=' + token : ''}`);
    brushed += page_.trials.filter((t) => Math.log10(t.parameters.lr) >= -2.5 && Math.log10(t.parameters.lr) <= -1.5).length;
    token = page_.next_page_token;
    if (!token) break;
  }
  await page.evaluate(() => Plotly.restyle('chart-parcoords', { 'dimensions[0].constraintrange': [[-2.5, -1.5]] }));
  await page.waitForFunction((n) => document.querySelector('#row-count').textContent.startsWith(n + ' of'), brushed);
  await page.evaluate(() => Plotly.restyle('chart-parcoords', { 'dimensions[0].constraintrange': null }));
  await page.waitForFunction((n) => document.querySelector('#row-count').textContent.startsWith(n + ' of'), total);
  // `degree` is a child of `kernel: poly`: the rbf trials lack it and are drawn on its
  // "inactive" tick, not dropped (the chart draws every trial on every axis).
  const degree = await page.evaluate(() => {
    const d = document.getElementById('chart-parcoords').data[0].dimensions;
    const j = d.findIndex((x) => x.label === 'degree');
    return { j, n: d[j].values.length, nan: d[j].values.filter((v) => Number.isNaN(v)).length, first: d[j].ticktext[0], at: d[j].tickvals[0], lr: d[0].values.length };
  });
  assert(degree.j === 3 && degree.first === 'inactive', 'degree axis ' + JSON.stringify(degree));
  assert(degree.n === degree.lr && degree.nan === 0, 'every trial drawn on degree: ' + JSON.stringify(degree));
  let rbf = 0;
  token = '';
  for (let i = 0; i < 10; i++) {
    const page_ = await get(`/v1/studies/${SMALL}/trials?page_size=1000${token ? '&page_token=' + token : ''}`);
    rbf += page_.trials.filter((t) => t.parameters.degree === undefined).length;
    token = page_.next_page_token;
    if (!token) break;
  }
  assert(rbf > 0 && rbf < total, `rbf trials ${rbf} of ${total}`);
  // Brushing the inactive tick keeps exactly the trials without a degree.
  await page.evaluate(([j, at]) => Plotly.restyle('chart-parcoords', { [`dimensions[${j}].constraintrange`]: [[at - 0.1, at + 0.1]] }), [degree.j, degree.at]);
  await page.waitForFunction((n) => document.querySelector('#row-count').textContent.startsWith(n + ' of'), rbf);
  await page.evaluate((j) => Plotly.restyle('chart-parcoords', { [`dimensions[${j}].constraintrange`]: null }), degree.j);
  await page.waitForFunction((n) => document.querySelector('#row-count').textContent.startsWith(n + ' of'), total);
  const curves = await page.evaluate(() => document.getElementById('chart-curves').data.length);
  assert(curves === total, `learning curves ${curves} vs ${total}`);
  // The seeder's poor trials were stopped by the study's median rule: exactly those are dashed.
  const stoppedIds = [];
  token = '';
  for (let i = 0; i < 10; i++) {
    const page_ = await get(`/v1/studies/${SMALL}/trials?page_size=1000${token ? '&page_token=' + token : ''}`);
    stoppedIds.push(...page_.trials.filter((t) => t.early_stopped).map((t) => t.id));
    token = page_.next_page_token;
    if (!token) break;
  }
  const dashedIds = await page.evaluate(() => document.getElementById('chart-curves').data
    .filter((t) => t.line.dash === 'dash').map((t) => Number(t.name.replace('trial ', ''))));
  assert(stoppedIds.length > 0, 'the median rule stopped some trials');
  assert(JSON.stringify(dashedIds.sort((a, b) => a - b)) === JSON.stringify(stoppedIds.sort((a, b) => a - b)),
    `dashed curves ${dashedIds} vs early-stopped trials ${stoppedIds}`);
  await shot('study.png');
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: join(ARTIFACTS, 'study-top.png') });
});

await test('CSV export holds the filtered table', async () => {
  await page.selectOption('#table-param', 'layers');
  await page.fill('#table-min', '2');
  await page.fill('#table-max', '3');
  const count = num((await text('#row-count')).split(' ')[0]);
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('#export-csv')]);
  const csv = readFileSync(await download.path(), 'utf8').trim().split('\n');
  assert(csv[0] === 'trial,state,early_stopped,accuracy,lr,layers,kernel,degree,tags,train_loss', 'header ' + csv[0]);
  assert(csv.length === count + 1, `csv rows ${csv.length - 1} vs table ${count}`);
  assert(csv.slice(1).every((l) => ['2', '3'].includes(l.split(',')[5])), 'only filtered rows');
  await page.fill('#table-min', '');
  await page.fill('#table-max', '');
});

await test('a trial completed through the API appears without a reload', async () => {
  const before = await page.evaluate(() => window.augur.updates);
  const t0 = Date.now();
  const id = await addTrial(SMALL, 1.25);
  await page.waitForFunction(() => document.querySelector('#best-value').textContent === '1.25', null, { timeout: 5000 });
  const ms = Date.now() - t0;
  assert(await page.evaluate((b) => window.augur.updates > b, before), 'updated live, not reloaded');
  assert((await text('#best-trial')) === '#' + id, 'best trial moved');
  const total = (await get(`/v1/studies/${SMALL}`)).trial_counts.total;
  assert((await text('#row-count')).endsWith(`of ${total} trials`), 'row count grew');
  console.log(`live update (small study): ${ms} ms`);
});

await test('notes, tags and user attributes: shown in the table, filtered, edited on the page (issue 27, item 10)', async () => {
  await page.goto(`${base}/studies/${SMALL}`);
  await page.waitForFunction(() => window.augur.marks.table);
  assert((await text('#study-annotations summary')).includes('digits'), 'study tags shown');
  assert((await page.inputValue('#study-note')) === 'SVC on digits, first sweep', 'study note');
  const heads = await page.locator('.vt-head div').allTextContents();
  assert(heads.includes('tags') && heads.some((x) => x.startsWith('train_loss')), 'columns ' + heads);
  const trials = [];
  let token = '';
  for (let i = 0; i < 10; i++) {
    const page_ = await get(`/v1/studies/${SMALL}/trials?page_size=1000${token ? '&page_token=' + token : ''}`);
    trials.push(...page_.trials);
    token = page_.next_page_token;
    if (!token) break;
  }
  const tagged = trials.filter((t) => (t.tags || []).includes('poly-run')).length;
  assert(tagged === 20, 'tagged trials ' + tagged);
  await page.selectOption('#table-tag', 'poly-run');
  await page.waitForFunction((n) => document.querySelector('#row-count').textContent.startsWith(n + ' of'), tagged);
  await page.selectOption('#table-tag', '');
  // A range on a user attribute, as on a parameter.
  const inRange = trials.filter((t) => t.user_attrs && t.user_attrs.train_loss >= 0.1 && t.user_attrs.train_loss <= 0.2).length;
  await page.selectOption('#table-param', 'u:train_loss');
  await page.fill('#table-min', '0.1');
  await page.fill('#table-max', '0.2');
  await page.waitForFunction((n) => document.querySelector('#row-count').textContent.startsWith(n + ' of'), inRange);
  await page.fill('#table-min', '');
  await page.fill('#table-max', '');
  await page.selectOption('#table-param', '');
  // The note and tags are edited on the page and stored.
  await page.fill('#study-note', 'next: a wider lr range');
  await page.fill('#study-tags', 'digits, svc, sweep-1');
  await page.click('#study-save-annotations');
  await page.waitForFunction(() => document.querySelector('#study-annotation-status').textContent === 'saved');
  const saved = await get(`/v1/studies/${SMALL}`);
  assert(saved.note === 'next: a wider lr range' && JSON.stringify(saved.tags) === '["digits","svc","sweep-1"]', 'saved ' + JSON.stringify([saved.note, saved.tags]));
  // The trial page shows its user attributes and tags.
  await page.goto(`${base}/studies/${SMALL}/trials/1`);
  await page.waitForFunction(() => window.augur.marks.trial);
  assert((await text('#trial-user-attrs')).includes('train_loss'), 'user attrs on the trial page');
  assert((await page.inputValue('#trial-tags')) === 'poly-run', 'trial tags');
  // The studies page shows the tags, and filters by one.
  await page.goto(`${base}/?tag=sweep-1`);
  await page.waitForFunction(() => window.augur.marks.studies);
  const listed = await page.locator('#studies tbody tr').evaluateAll((rows) => rows.map((r) => r.dataset.study));
  assert(JSON.stringify(listed) === JSON.stringify([String(SMALL)]), 'tag filter ' + listed);
  await shot('annotations.png');
});

await test('trial page shows parameters, outcome and learning curve', async () => {
  await page.goto(`${base}/studies/${SMALL}/trials/${bestSmall.id}`);
  await page.waitForFunction(() => window.augur.marks.charts);
  const params = await text('#trial-params');
  assert(params.includes('lr') && params.includes('kernel'), params);
  assert((await text('#trial-outcome')).includes(String(Number(bestSmall.final_measurement.metrics.accuracy.toPrecision(6)))), 'final value');
  const points = await page.evaluate(() => document.getElementById('chart-trial-curve').data[0].x.length);
  assert(points === bestSmall.measurements.length, `curve points ${points}`);
  assert((await text('#model-dir')).length > 0, 'model dir placeholder');
  await shot('trial.png');
});

await test('a PBT trial page shows its budget and lineage, linked to its parent', async () => {
  const trials = (await get(`/v1/studies/${PBT}/trials`)).trials;
  const child = trials.find((t) => t.lineage);
  assert(child, 'a trial copied another: ' + JSON.stringify(trials.map((t) => t.lineage)));
  const segment = child.lineage.segments.find((s) => s.parent != null);
  await page.goto(`${base}/studies/${PBT}/trials/${child.id}`);
  await page.waitForFunction(() => window.augur.marks.trial);
  assert((await text('#trial-outcome')).includes('budget'), 'the budget in the outcome');
  const rows = await page.locator('#trial-lineage tbody tr').count();
  assert(rows === child.lineage.segments.length, `${rows} lineage rows`);
  const href = await page.locator(`#trial-lineage a[href$="/trials/${segment.parent}"]`).count();
  assert(href >= 1, 'a link to the parent trial');
  const lr = segment.parameters.lr;
  const shown = Math.abs(lr) < 1e-3 ? lr.toExponential(4) : String(Number(lr.toPrecision(6)));
  assert((await text('#trial-lineage')).includes(shown), `the segment's lr ${shown}`);
  await shot('trial-lineage.png');
  // The study page draws the rung chart: each trial's metric at the budgets 1, 2, 3.
  await page.goto(`${base}/studies/${PBT}`);
  await page.waitForFunction(() => window.augur.marks.charts && document.getElementById('chart-rungs').data);
  const heads = await page.locator('.vt-head div').allTextContents();
  assert(heads.some((t) => t.startsWith('budget')), 'a budget column: ' + heads);
  const rungs = await page.evaluate(() => document.getElementById('chart-rungs').data.map((t) => t.x));
  assert(rungs.length === 4 && rungs.every((x) => JSON.stringify(x) === '[1,2,3]'), 'rung chart ' + JSON.stringify(rungs));
  await shot('rungs.png');
});

await test('a trial page links to the TensorBoard augur tensorboard names, only an http(s) one', async () => {
  const setUrl = (url) => api('PATCH', `/v1/studies/${SMALL}`, { user_attrs: { 'augur:tensorboard_url': url } });
  const linkOf = async () => {
    await page.goto(`${base}/studies/${SMALL}/trials/1`);
    await page.waitForFunction(() => window.augur.marks.trial);
    const link = page.locator('#tensorboard-link');
    return (await link.count()) ? link.getAttribute('href') : null;
  };
  try {
    assert((await linkOf()) === null, 'no link while none runs');
    await setUrl('http://127.0.0.1:6006/');
    assert((await linkOf()) === 'http://127.0.0.1:6006/', 'the link');
    await setUrl('javascript:alert(1)');
    assert((await linkOf()) === null, 'no javascript: link');
  } finally {
    await setUrl(null);
  }
});

await test('compare page puts studies side by side', async () => {
  await page.goto(`${base}/compare?studies=${SMALL},${MULTI}`);
  await page.waitForFunction(() => window.augur.marks.charts);
  assert(await page.locator('#compare-table tbody tr').count() === 2, 'two rows');
  const best = (await get(`/v1/studies/${SMALL}`)).best_trial.final_measurement.metrics.accuracy;
  assert(close(num(await text(`#compare-table tr[data-study="${SMALL}"] td.best`)), best), 'best value');
  assert(await page.evaluate(() => document.getElementById('chart-compare').data.length) === 2, 'two curves');
  // Both maximize accuracy: one axis, which says which way is better.
  const one = await page.evaluate(() => { const el = document.getElementById('chart-compare'); return { axes: el.data.map((t) => t.yaxis), title: el.layout.yaxis.title.text, y2: !!el.layout.yaxis2 }; });
  assert(JSON.stringify(one.axes) === '["y","y"]' && !one.y2, 'one shared axis: ' + JSON.stringify(one));
  assert(one.title === 'best accuracy (higher is better)', one.title);
  await shot('compare.png');
  // A minimized loss beside them gets an axis of its own (issue 27, item 9).
  await page.goto(`${base}/compare?studies=${SMALL},${MULTI},${HOSTILE}`);
  await page.waitForFunction(() => window.augur.marks.charts);
  const three = await page.evaluate(() => { const el = document.getElementById('chart-compare'); return { axes: el.data.map((t) => t.yaxis), y2: el.layout.yaxis2 && el.layout.yaxis2.title.text }; });
  assert(JSON.stringify(three.axes) === '["y","y","y2"]', 'axes ' + JSON.stringify(three));
  assert(three.y2 === 'best loss (lower is better)', three.y2);
  await shot('compare-goals.png');
});

await test('a study whose every trial failed says so where its charts would be, and draws no empty axes (issue 27, item 9)', async () => {
  await page.goto(`${base}/studies/${FAILED}`);
  await page.waitForFunction(() => window.augur.marks.charts);
  for (const id of ['chart-history', 'chart-importance', 'chart-parcoords', 'chart-contour']) {
    const said = await page.evaluate((id) => document.getElementById(id).textContent, id);
    assert(said.includes('No trial has completed with accuracy yet: 3 failed or infeasible'), `${id}: ${said}`);
    assert(await page.locator(`#${id} svg`).count() === 0, id + ' draws no axes');
  }
  // The log-scale switch of the learning curves is there, and switches a drawn chart.
  await page.goto(`${base}/studies/${SMALL}`);
  await page.waitForFunction(() => window.augur.marks.charts);
  await page.check('#chart-curves-log');
  await page.waitForFunction(() => document.getElementById('chart-curves').layout.yaxis.type === 'log');
  await page.uncheck('#chart-curves-log');
  await page.waitForFunction(() => document.getElementById('chart-curves').layout.yaxis.type === 'linear');
});

await test('an open server offers no sign-out: there is no one signed in (issue 27; with tokens, tests/api/login.rs)', async () => {
  await page.goto(`${base}/`);
  await page.waitForSelector('header.top nav');
  assert(await page.locator('header.top .signout').count() === 0, 'no sign-out button');
});

await test('two-metric study shows its Pareto front', async () => {
  await page.goto(`${base}/studies/${MULTI}`);
  await page.waitForFunction(() => window.augur.marks.charts);
  const front = (await get(`/v1/studies/${MULTI}/optimal_trials`)).trials.map((t) => t.id).sort((a, b) => a - b);
  const shown = await page.evaluate(() => document.getElementById('chart-pareto').data[1].text.slice().sort((a, b) => a - b));
  assert(JSON.stringify(front) === JSON.stringify(shown), `front ${front} vs ${shown}`);
  await shot('pareto.png');
});

// RFC 4180 fields: quoted fields may hold commas, doubled quotes and line breaks.
function parseCsv(text) {
  const rows = [];
  let row = [];
  let field = '';
  let quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c !== '"') field += c;
      else if (text[i + 1] === '"') { field += '"'; i++; } else quoted = false;
    } else if (c === '"') quoted = true;
    else if (c === ',') { row.push(field); field = ''; } else if (c === '\n') { row.push(field); rows.push(row); row = []; field = ''; } else field += c;
  }
  if (field || row.length) { row.push(field); rows.push(row); }
  return rows;
}
// What a spreadsheet runs as a formula: text starting with one of these (numbers aside).
const FORMULA_START = /^[=+\-@\t\r]/;
const isNumber = (s) => s.trim() !== '' && !Number.isNaN(Number(s));

await test('CSV export: cells a spreadsheet would run as formulas are neutralised, negative numbers stay numbers (issue 10, finding 8)', async () => {
  await page.goto(`${base}/studies/${HOSTILE}`);
  await page.waitForFunction(() => window.augur.marks.table);
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('#export-csv')]);
  const raw = readFileSync(await download.path(), 'utf8');
  const rows = parseCsv(raw);
  const header = rows[0];
  assert(header.join(',') === 'trial,state,early_stopped,loss,x,label,tags', 'header ' + header);
  // The seeder's first trial: label =HYPERLINK(…), loss -0.5.
  const first = rows.find((r) => r[0] === '1');
  assert(first[5] === `'=HYPERLINK("http://evil.example","x")`, 'formula cell written as ' + JSON.stringify(first[5]));
  assert(first[3] === '-0.5' && raw.split('\n').some((l) => l.startsWith('1,') && l.includes(',-0.5,')),
    'the negative metric stays the number -0.5: ' + JSON.stringify(first));
  const formulas = rows.flat().filter((f) => FORMULA_START.test(f) && !isNumber(f));
  assert(formulas.length === 0, 'cells a spreadsheet would run: ' + JSON.stringify(formulas));
  assert(rows.some((r) => r[5] === '<a href="http://evil.example">x</a>'), 'other text is kept as it is');
  assert(rows.some((r) => r[5] === '-1'), 'text that is only a number stays that number');
  // Characters the fixture cannot store (names refuse control characters), on the function itself.
  const cells = await page.evaluate(async () => {
    const { csvCell } = await import('/dashboard/js/csv.js');
    return ['\t=1+1', '\r=1+1', '@SUM(1)', '+1+cmd', 'a;=1', -0.5, '-0.5', 'plain'].map(csvCell);
  });
  const want = ['"\'\t=1+1"', '"\'\r=1+1"', '"\'@SUM(1)"', '"\'+1+cmd"', '"a;=1"', '-0.5', '-0.5', 'plain'];
  assert(JSON.stringify(cells) === JSON.stringify(want), `csvCell gave ${JSON.stringify(cells)}, want ${JSON.stringify(want)}`);
});

// Links and text of every chart; the mode bar's buttons are <a> elements of Plotly's own.
const chartContents = () => page.evaluate(() => Object.fromEntries([...document.querySelectorAll('.js-plotly-plot')].map((plot) => [plot.id, {
  links: [...plot.querySelectorAll('a:not(.modebar-btn)')].map((a) => a.outerHTML),
  text: [...plot.querySelectorAll('svg')].map((svg) => svg.textContent).join(' '),
}])));

await test('charts show hostile categories as text, never as links or markup (issue 10, finding 9)', async () => {
  await page.goto(`${base}/studies/${HOSTILE}`);
  await page.waitForFunction(() => window.augur.marks.charts);
  const charts = await chartContents();
  assert(Object.keys(charts).length >= 6, 'charts drawn: ' + Object.keys(charts));
  const links = Object.entries(charts).filter(([, c]) => c.links.length).map(([id, c]) => `${id}: ${c.links}`);
  assert(links.length === 0, 'links inside charts: ' + links.join('; '));
  await shot('hostile-study.png');
  for (const id of ['slice-label', 'chart-contour', 'chart-parcoords']) {
    for (const label of ['<a href="http://evil.example">x</a>', '<b>bold</b>']) {
      assert(charts[id].text.includes(label), `${id} shows ${label} literally: ${charts[id].text.slice(0, 400)}`);
    }
  }
});

await test('the compare chart shows a hostile study name as text (issue 10, finding 9)', async () => {
  const name = (await get(`/v1/studies/${HOSTILE}`)).name;
  await page.goto(`${base}/compare?studies=${SMALL},${HOSTILE}`);
  await page.waitForFunction(() => window.augur.marks.charts);
  const chart = (await chartContents())['chart-compare'];
  assert(chart.links.length === 0, 'links in the chart: ' + chart.links);
  assert(chart.text.includes(`#${HOSTILE} ${name} (loss)`), 'the legend shows the name literally: ' + chart.text.slice(0, 400));
  await shot('hostile-compare.png');
});

await test('a warm-started study names the studies it learns from (issue 14)', async () => {
  await page.goto(`${base}/studies/${WARM}`);
  await page.waitForSelector('#warm-start');
  const shown = await text('#warm-start');
  assert(shown.includes(`warm-started from #${SMALL}`), 'warm start shown: ' + shown);
  const href = await page.locator('#warm-start a').first().getAttribute('href');
  assert(href === `/studies/${SMALL}`, 'links to the prior study: ' + href);
  const plain = await page.goto(`${base}/studies/${SMALL}`).then(() => page.locator('#warm-start').count());
  assert(plain === 0, 'a cold study says nothing');
});

await test('a cluster trial shows the log of each replica, the primary first (issue 12)', async () => {
  await page.goto(`${base}/studies/${CLUSTER}/trials/1`);
  await page.waitForFunction(() => (document.querySelector('#log-text') || {}).textContent?.includes('says hello'))
    .catch(async (e) => { throw new Error(`${e.message}; the logs card: ${await page.locator('#logs').innerHTML()}`); });
  assert((await text('#log-text')).includes('replica workerpool0-0 says hello'), 'the primary log first');
  const options = await page.locator('#log-replica option').evaluateAll((os) => os.map((o) => o.value));
  assert(JSON.stringify(options) === JSON.stringify(['workerpool0-0', 'workerpool1-0', 'workerpool1-1']), 'replicas ' + options);
  await page.selectOption('#log-replica', 'workerpool1-1');
  await page.waitForFunction(() => document.querySelector('#log-text').textContent.includes('replica workerpool1-1 says hello'));
  assert(!(await text('#log-text')).includes('workerpool0-0 says'), 'only that replica\'s log');
  // The primary's model file, listed and downloaded from the page (issue 27, item 10).
  await page.waitForSelector('#artifact-list a');
  const files = await page.locator('#artifact-list a').allTextContents();
  assert(JSON.stringify(files) === '["weights.bin"]', 'artifacts ' + files);
  const href = await page.locator('#artifact-list a').first().getAttribute('href');
  const body = await page.evaluate((u) => fetch(u).then((r) => r.text()), href);
  assert(body === 'weights', 'downloaded ' + body);
  await shot('cluster-trial.png');
});

await test(`large study: first paint and live updates measured (target ${TARGET_MS} ms, limit ${LIMIT_MS} ms)`, async () => {
  const info = await get(`/v1/studies/${LARGE}`);
  const total = info.trial_counts.total;
  await page.goto(`${base}/studies/${LARGE}`);
  await page.waitForFunction(() => window.augur.marks.history, null, { timeout: 30000 });
  const marks = await page.evaluate(() => window.augur.marks);
  const paint = await page.evaluate(() => (performance.getEntriesByType('paint').find((e) => e.name === 'first-contentful-paint') || {}).startTime);
  console.log(`large study (${total} trials): first contentful paint ${Math.round(paint)} ms, ` +
    `summary ${Math.round(marks.summary)} ms, table ${Math.round(marks.table)} ms, history chart (first meaningful paint) ${Math.round(marks.history)} ms`);
  assert((await text('#row-count')) === `${total} of ${total} trials`, 'all rows');
  assert(close(num(await text('#best-value')), info.best_trial.final_measurement.metrics.accuracy), 'best value');
  await page.waitForFunction(() => window.augur.marks.charts, null, { timeout: 30000 });
  const dashed = await page.evaluate(() => document.getElementById('chart-curves').data.filter((t) => t.line.dash === 'dash').length);
  assert(dashed > 0, 'early-stopped curves are marked');
  await shot('large-study.png');

  // Scrolling: jump through the table and time the frames.
  const scroll = await page.evaluate(async () => {
    const el = document.getElementById('trial-table');
    const times = [];
    for (let k = 0; k < 60; k++) {
      const t = performance.now();
      el.scrollTop = (k / 60) * el.scrollHeight;
      await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
      times.push(performance.now() - t);
    }
    el.scrollTop = el.scrollHeight;
    await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
    const rows = el.querySelectorAll('.vt-row');
    return { worst: Math.max(...times), mean: times.reduce((a, b) => a + b) / times.length, last: rows[rows.length - 1].dataset.trial, rows: rows.length };
  });
  console.log(`large study: scrolling ${Math.round(scroll.mean)} ms per two frames on average, worst ${Math.round(scroll.worst)} ms; ${scroll.rows} rows in the DOM`);
  assert(scroll.rows < 100, 'only visible rows are in the DOM');
  assert(scroll.last === String(Math.max(...(await page.evaluate(() => Array.from(document.querySelectorAll('#trial-table .vt-row')).map((r) => Number(r.dataset.trial)))))), 'last row reached');

  const latencies = [];
  let best = info.best_trial.final_measurement.metrics.accuracy;
  for (let k = 1; k <= 3; k++) {
    best = Math.round((best + 0.01) * 1000) / 1000;
    const t0 = Date.now();
    await addTrial(LARGE, best);
    await page.waitForFunction((n) => document.querySelector('#row-count').textContent === `${n} of ${n} trials`, total + k, { timeout: 10000 });
    await page.waitForFunction((b) => Number(document.querySelector('#best-value').textContent) === b, best, { timeout: 10000 });
    latencies.push(Date.now() - t0);
  }
  console.log(`large study: live updates ${latencies.join(', ')} ms (API completion to the row and best value on screen)`);
  // A second visit finds the server's snapshot warm.
  await page.goto(`${base}/studies/${LARGE}`);
  await page.waitForFunction(() => window.augur.marks.history, null, { timeout: 30000 });
  const again = await page.evaluate(() => window.augur.marks);
  console.log(`large study, second visit: summary ${Math.round(again.summary)} ms, table ${Math.round(again.table)} ms, history chart ${Math.round(again.history)} ms`);
  const verdict = (ms) => (ms < TARGET_MS ? 'within' : 'OVER') + ` the ${TARGET_MS} ms target`;
  console.log(`large study: first meaningful paint ${Math.round(marks.history)} ms (${verdict(marks.history)}), ` +
    `slowest live update ${Math.max(...latencies)} ms (${verdict(Math.max(...latencies))}); load average ${(await import('node:os')).loadavg()[0].toFixed(1)}`);
  assert(marks.history < LIMIT_MS, `first meaningful paint ${Math.round(marks.history)} ms`);
  assert(Math.max(...latencies) < LIMIT_MS, `live update ${Math.max(...latencies)} ms`);
});

await browser.close();
const passed = results.filter((r) => r[1]).length;
console.log(`browser: ${passed} passed, ${results.length - passed} failed`);
process.exit(passed === results.length ? 0 : 1);
