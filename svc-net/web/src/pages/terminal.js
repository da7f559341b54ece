import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import '@xterm/xterm/css/xterm.css';
import { installCspShim } from '../csp-shim.js';
import { h, notice, replace } from '../dom.js';

/**
 * A shell on a node: xterm.js over the Proxy Service's terminal WebSocket. Binary frames carry
 * the terminal's bytes both ways, text frames the resize requests and the server's exit/error.
 */
export function terminalPage(main, { params, navigate }) {
  const node = params.get('node') || '';
  const login = params.get('login') || '';
  const status = h('div', { id: 'terminal-status', class: 'notice-slot', role: 'status', 'aria-live': 'polite' });
  if (!node || !login) {
    replace(main, h('h1', {}, 'Terminal'), notice('error', 'Choose a server and a login on the Resources page.'));
    return null;
  }
  installCspShim();
  const screen = h('div', { id: 'terminal', class: 'terminal', 'aria-label': `Terminal on ${node} as ${login}` });
  const back = h('button', { type: 'button', class: 'secondary', onclick: () => navigate('/resources') }, 'Back to resources');
  const disconnect = h('button', { type: 'button', class: 'secondary', onclick: () => close('You closed the session.') }, 'Disconnect');
  replace(main, h('div', { class: 'terminal-head' }, h('h1', {}, `${login}@${node}`), disconnect, back), status, screen);

  const term = new Terminal({
    cursorBlink: true,
    convertEol: false,
    fontFamily: 'ui-monospace, "DejaVu Sans Mono", "Liberation Mono", monospace',
    fontSize: 14,
    scrollback: 5000,
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(screen);
  try {
    fit.fit();
  } catch {
    // Not laid out yet: the default 80×24 stays until the next resize.
  }

  const url = new URL('/webapi/terminal', location.href);
  url.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
  url.searchParams.set('node', node);
  url.searchParams.set('login', login);
  url.searchParams.set('cols', String(term.cols));
  url.searchParams.set('rows', String(term.rows));
  const ws = new WebSocket(url);
  ws.binaryType = 'arraybuffer';
  const encoder = new TextEncoder();
  let ended = false;
  replace(status, notice('info', `Connecting to ${node} as ${login}…`));

  function end(kind, text) {
    if (ended) return;
    ended = true;
    disconnect.disabled = true;
    replace(status, notice(kind, text));
    screen.dataset.closed = 'true';
  }

  function close(text) {
    end('info', text);
    if (ws.readyState === WebSocket.OPEN || ws.readyState === WebSocket.CONNECTING) ws.close(1000);
  }

  ws.addEventListener('open', () => {
    replace(status, notice('info', `Connected to ${node} as ${login}.`));
    screen.dataset.connected = 'true';
    // The window may have been fitted again since the URL was built.
    ws.send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));
    term.focus();
  });
  ws.addEventListener('message', (ev) => {
    if (typeof ev.data !== 'string') {
      term.write(new Uint8Array(ev.data));
      return;
    }
    let msg;
    try {
      msg = JSON.parse(ev.data);
    } catch {
      return;
    }
    if (msg.type === 'exit') end('info', `Session ended (exit code ${msg.code}).`);
    else if (msg.type === 'error') end('error', `Session error: ${msg.message}`);
  });
  ws.addEventListener('close', (ev) => {
    if (!ended) {
      end(ev.code === 1000 ? 'info' : 'error', ev.code === 1000 ? 'Connection closed.' : `Connection lost (code ${ev.code}${ev.reason ? `: ${ev.reason}` : ''}).`);
    }
  });

  term.onData((data) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(data));
  });
  term.onBinary((data) => {
    if (ws.readyState !== WebSocket.OPEN) return;
    const bytes = new Uint8Array(data.length);
    for (let i = 0; i < data.length; i++) bytes[i] = data.charCodeAt(i) & 0xff;
    ws.send(bytes);
  });
  term.onResize(({ cols, rows }) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', cols, rows }));
  });
  const observer = new ResizeObserver(() => {
    try {
      fit.fit();
    } catch {
      // Hidden or detached: nothing to fit.
    }
  });
  observer.observe(screen);

  return () => {
    observer.disconnect();
    if (ws.readyState === WebSocket.OPEN || ws.readyState === WebSocket.CONNECTING) ws.close(1000);
    term.dispose();
  };
}
