// The trial page's terminal: a shell (or a command) in a running trial's replica, over the
// exec route's WebSocket (`api/exec.rs`, the protocol `augur trial shell` speaks), drawn by
// xterm.js (vendored under `assets/vendor/`, loaded when a terminal first opens).
//
// A session runs commands, so the dashboard's cookie never opens one: it rides along on
// requests that pages of other sites make the browser send. The user pastes an API token
// instead (the study's creator's or an admin's), kept in this tab's sessionStorage only.
// A browser cannot set Authorization on a WebSocket, so the socket offers the token as the
// subprotocol `base64url.bearer.augur.<token>` beside `augur.exec`, which the server selects.

import { h } from './dom.js';

const TOKEN_KEY = 'augur.terminal.token';
const PRIMARY = 'workerpool0-0';
/** What an empty command runs, as `augur trial shell` does: bash when the replica has it, sh otherwise. */
const DEFAULT_SHELL = ['/bin/sh', '-c', 'if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi'];

let xtermPromise = null;

/** Resolves once `el` (a script or style sheet) has loaded. */
function loaded(el, what) {
  return new Promise((resolve, reject) => {
    el.onload = resolve;
    el.onerror = () => reject(new Error(`could not load ${what}`));
    document.head.append(el);
  });
}

/** xterm.js and its fit addon (~490 KB), loaded once, on the first terminal opened. */
function xterm() {
  if (!xtermPromise) {
    const at = (file) => `/dashboard/vendor/${file}?v=${document.body.dataset.version}`;
    xtermPromise = Promise.all([
      loaded(h('link', { rel: 'stylesheet', href: at('xterm.css') }), 'xterm.css'),
      loaded(h('script', { src: at('xterm.js') }), 'xterm.js')
        .then(() => loaded(h('script', { src: at('addon-fit.js') }), 'addon-fit.js')),
    ]).then(() => ({ Terminal: window.Terminal, FitAddon: window.FitAddon.FitAddon }));
    xtermPromise.catch(() => { xtermPromise = null; });
  }
  return xtermPromise;
}

/** A token as the subprotocol carries it: base64url of its UTF-8, without padding. */
function base64url(text) {
  const bytes = new TextEncoder().encode(text);
  let binary = '';
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

/**
 * The Terminal card of a running trial dispatched by this server: token, replica, command,
 * and the terminal itself once opened. `replicas` lists the trial's replicas, the primary first.
 */
export function terminalCard(study, trialId, replicas) {
  const token = h('input', {
    type: 'password', id: 'terminal-token', autocomplete: 'off', size: 28,
    placeholder: 'API token', value: sessionStorage.getItem(TOKEN_KEY) || '',
    title: "The study's creator's or an admin's token (augur token create); kept in this tab only",
  });
  const replica = replicas.length > 1
    ? h('select', { id: 'terminal-replica' }, ...replicas.map((r) => h('option', { value: r }, r === PRIMARY ? `${r} (primary)` : r)))
    : null;
  const command = h('input', { id: 'terminal-command', size: 24, placeholder: 'command (empty: a shell)', autocomplete: 'off' });
  const openButton = h('button', { type: 'button', id: 'terminal-open' }, 'Open terminal');
  const closeButton = h('button', { type: 'button', id: 'terminal-close', class: 'secondary', hidden: true }, 'Close');
  const status = h('span', { id: 'terminal-status', class: 'muted' });
  const screen = h('div', { id: 'terminal-screen', class: 'terminal', hidden: true });
  // The latest session; its output stays on the screen after it ends, until the next opens.
  let session = null;
  const idle = () => { openButton.hidden = false; closeButton.hidden = true; };
  const show = (text, failed) => { status.textContent = text; status.className = failed ? 'error' : 'muted'; };

  openButton.addEventListener('click', async () => {
    if (session) session.close();
    session = null;
    const secret = token.value.trim();
    if (secret) sessionStorage.setItem(TOKEN_KEY, secret);
    else sessionStorage.removeItem(TOKEN_KEY);
    openButton.hidden = true;
    closeButton.hidden = false;
    show('connecting…', false);
    try {
      session = await openSession({
        study, trialId, token: secret, replica: replica ? replica.value : PRIMARY, command: command.value.trim(),
        screen, onStatus: show, onEnd: idle,
      });
    } catch (e) {
      show(String(e.message || e), true);
      idle();
    }
  });
  closeButton.addEventListener('click', () => {
    if (session) session.close();
    session = null;
    screen.hidden = true;
    show('closed', false);
    idle();
  });

  return h('div', { class: 'card', id: 'terminal-card' }, h('h2', {}, 'Terminal'),
    h('p', { class: 'muted' }, "A shell in this trial's replica, as ", h('code', {}, 'augur trial shell'),
      ' opens one. A server that requires tokens needs one of the study\'s creator or an admin, pasted here: the sign-in cookie never opens a session.'),
    h('div', { class: 'bar' }, token, replica, command, openButton, closeButton, status),
    screen);
}

/**
 * Opens a session on a new terminal in `screen`; resolves to a handle whose `close()` ends it
 * (closing the socket, which makes the server kill the command).
 */
async function openSession({ study, trialId, token, replica, command, screen, onStatus, onEnd }) {
  const { Terminal, FitAddon } = await xterm();
  screen.hidden = false;
  screen.replaceChildren();
  const term = new Terminal({ convertEol: false, cursorBlink: true, fontSize: 13, scrollback: 5000 });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(screen);
  fit.fit();

  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const protocols = ['augur.exec'];
  if (token) protocols.push(`base64url.bearer.augur.${base64url(token)}`);
  const socket = new WebSocket(`${scheme}//${location.host}/v1/studies/${study}/trials/${trialId}/exec`, protocols);
  socket.binaryType = 'arraybuffer';
  const encoder = new TextEncoder();
  const resizes = new ResizeObserver(() => { fit.fit(); });
  let opened = false;
  let ended = false;

  const send = (data) => { if (socket.readyState === WebSocket.OPEN) socket.send(data); };
  term.onData((data) => send(encoder.encode(data)));
  // Bytes xterm.js reports as a binary string (some mouse reports): one byte per character.
  term.onBinary((data) => send(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff)));
  term.onResize(({ rows, cols }) => {
    send(JSON.stringify({ type: 'resize', rows, cols }));
    window.augur.terminal = { rows, cols };
  });

  const finish = (text, failed) => {
    if (ended) return;
    ended = true;
    resizes.disconnect();
    term.options.disableStdin = true;
    onStatus(text, failed);
    onEnd();
  };

  socket.addEventListener('open', () => {
    opened = true;
    fit.fit();
    const start = { command: command ? ['/bin/sh', '-c', command] : DEFAULT_SHELL, tty: true, rows: term.rows, cols: term.cols };
    if (replica !== PRIMARY) start.replica = replica;
    socket.send(JSON.stringify(start));
    resizes.observe(screen);
    term.focus();
    // The size the remote terminal was given, for the browser test (`marks.js`).
    window.augur.terminal = { rows: term.rows, cols: term.cols };
    onStatus(`connected to ${replica}`, false);
  });
  socket.addEventListener('message', (event) => {
    if (typeof event.data !== 'string') {
      // The first byte names the stream; a terminal has stdout only (tag 1), so both go
      // to the screen alike.
      const bytes = new Uint8Array(event.data);
      if (bytes.length > 1) term.write(bytes.subarray(1));
      return;
    }
    let message;
    try { message = JSON.parse(event.data); } catch { return; }
    if (message.type === 'exit') {
      const how = message.signal ? `killed by SIG${message.signal}` : `exited with status ${message.code}`;
      term.write(`\r\n[session ${how}]\r\n`);
      finish(`session ${how}`, false);
    } else if (message.type === 'error') {
      const error = message.error || {};
      const text = `${message.status}${error.field ? ` (${error.field})` : ''}: ${error.message || 'the session could not start'}`;
      term.write(`\r\n[${text}]\r\n`);
      finish(text, true);
    }
  });
  socket.addEventListener('close', () => {
    if (ended) return;
    if (opened) {
      finish('connection closed', false);
      return;
    }
    // A refused upgrade tells the page nothing: ask the same route over plain HTTP, which
    // answers with the refusal (or, when all is well, that a session is a WebSocket).
    screen.hidden = true;
    explainRefusal(study, trialId, token).then((why) => finish(why, true));
  });

  return {
    close() {
      finish('closed', false);
      if (socket.readyState === WebSocket.CONNECTING || socket.readyState === WebSocket.OPEN) socket.close();
      term.dispose();
    },
  };
}

/** Why the server refused to open a session: its answer to the route as a plain GET, with the token as a header. */
async function explainRefusal(study, trialId, token) {
  if (!token) return 'refused: paste an API token (the study\'s creator\'s or an admin\'s)';
  try {
    const response = await fetch(`/v1/studies/${study}/trials/${trialId}/exec`, {
      credentials: 'omit', headers: { Accept: 'application/json', Authorization: `Bearer ${token}` },
    });
    const body = await response.json().catch(() => ({}));
    const error = body.error || {};
    if (response.status === 400) return 'the connection failed (the server accepts this token and trial)';
    return `refused, ${response.status}${error.field ? ` (${error.field})` : ''}: ${error.message || response.statusText}`;
  } catch (e) {
    return `the connection failed: ${e.message || e}`;
  }
}
