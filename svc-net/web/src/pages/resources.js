import { query, request } from '../api.js';
import { h, notice, replace } from '../dom.js';

const KINDS = [
  { kind: 'node', label: 'Servers' },
  { kind: 'app', label: 'Applications' },
  { kind: 'db', label: 'Databases' },
  { kind: 'kube_cluster', label: 'Kubernetes' },
  { kind: 'windows_desktop', label: 'Desktops' },
];

function labelList(labels) {
  const entries = Object.entries(labels || {}).sort(([a], [b]) => a.localeCompare(b));
  if (entries.length === 0) return h('span', { class: 'muted' }, 'none');
  return h('ul', { class: 'labels' }, entries.map(([k, v]) => h('li', { class: 'label' }, `${k}: ${v}`)));
}

/**
 * Resources the user's roles allow, one tab per kind, with labels and a search box; "Connect"
 * opens a terminal on a node (login picker) or an app in a new tab.
 */
export async function resourcesPage(main, { params, navigate }) {
  let kind = KINDS.some((k) => k.kind === params.get('kind')) ? params.get('kind') : 'node';
  const search = h('input', { id: 'resource-search', type: 'search', value: params.get('search') || '' });
  const results = h('div', { id: 'resource-results', 'aria-live': 'polite' });
  const status = h('div', { class: 'notice-slot' });

  const tabs = KINDS.map((k) =>
    h(
      'button',
      {
        type: 'button',
        role: 'tab',
        id: `tab-${k.kind}`,
        'aria-controls': 'resource-results',
        'data-kind': k.kind,
        onclick: () => select(k.kind, true),
        onkeydown: (e) => {
          const i = KINDS.findIndex((x) => x.kind === k.kind);
          let j = null;
          if (e.key === 'ArrowRight') j = (i + 1) % KINDS.length;
          if (e.key === 'ArrowLeft') j = (i + KINDS.length - 1) % KINDS.length;
          if (j !== null) {
            e.preventDefault();
            select(KINDS[j].kind, true);
          }
        },
      },
      k.label,
    ),
  );

  function syncTabs(focus) {
    for (const t of tabs) {
      const on = t.dataset.kind === kind;
      t.setAttribute('aria-selected', on ? 'true' : 'false');
      t.tabIndex = on ? 0 : -1;
      if (on && focus) t.focus();
    }
    results.setAttribute('aria-labelledby', `tab-${kind}`);
  }

  function select(k, focus) {
    kind = k;
    syncTabs(focus);
    history.replaceState(null, '', `/web/resources${query({ kind, search: search.value })}`);
    load();
  }

  async function connectApp(item, button) {
    replace(status);
    button.disabled = true;
    try {
      const { url } = await request('POST', '/webapi/sessions/app', { app: item.name });
      const win = window.open(url, '_blank', 'noopener');
      if (win === null) {
        // noopener windows return null even when they opened; give a link too.
        replace(status, notice('info', 'The app opened in a new tab. '), h('a', { href: url, target: '_blank', rel: 'noopener noreferrer' }, `Open ${item.name} again`));
      }
    } catch (e) {
      replace(status, notice('error', `Cannot open ${item.name}: ${e.message}`));
    } finally {
      button.disabled = false;
    }
  }

  function connectCell(item) {
    if (item.kind === 'node') {
      const logins = item.logins || [];
      if (logins.length === 0) return h('span', { class: 'muted' }, 'no login allowed');
      const id = `login-${item.name}`;
      const select = h('select', { id, class: 'login-picker' }, logins.map((l) => h('option', { value: l }, l)));
      return h(
        'form',
        {
          class: 'connect',
          onsubmit: (e) => {
            e.preventDefault();
            navigate(`/terminal${query({ node: item.name, login: select.value })}`);
          },
        },
        h('label', { for: id, class: 'visually-hidden' }, `Login on ${item.hostname || item.name}`),
        select,
        h('button', { type: 'submit', 'aria-label': `Connect to ${item.hostname || item.name}` }, 'Connect'),
      );
    }
    if (item.kind === 'app') {
      const b = h('button', { type: 'button', 'aria-label': `Open ${item.name}` }, 'Connect');
      b.addEventListener('click', () => connectApp(item, b));
      return b;
    }
    return h('span', { class: 'muted' }, 'use tsh');
  }

  let generation = 0;
  async function load() {
    const mine = ++generation;
    replace(results, notice('info', 'Loading…'));
    let data;
    try {
      data = await request('GET', `/webapi/resources${query({ kind, search: search.value })}`);
    } catch (e) {
      if (mine === generation) replace(results, notice('error', e.message));
      return;
    }
    if (mine !== generation) return;
    const items = data.items || [];
    if (items.length === 0) {
      replace(results, notice('info', search.value ? 'Nothing matches the search.' : 'Nothing of this kind that your roles allow.'));
      return;
    }
    replace(
      results,
      h(
        'div',
        { class: 'table-wrap' },
        h(
          'table',
          { class: 'resources' },
          h('caption', { class: 'visually-hidden' }, KINDS.find((k) => k.kind === kind).label),
          h(
            'thead',
            {},
            h('tr', {}, h('th', { scope: 'col' }, 'Name'), h('th', { scope: 'col' }, 'Address'), h('th', { scope: 'col' }, 'Labels'), h('th', { scope: 'col' }, 'Connect')),
          ),
          h(
            'tbody',
            {},
            items.map((item) =>
              h(
                'tr',
                { 'data-name': item.name },
                h('th', { scope: 'row' }, item.hostname && item.hostname !== item.name ? [item.hostname, h('br'), h('small', { class: 'muted' }, item.name)] : item.name),
                h('td', {}, item.public_addr || item.addr || h('span', { class: 'muted' }, 'through the tunnel')),
                h('td', {}, labelList(item.labels)),
                h('td', {}, connectCell({ ...item, kind: item.kind || kind })),
              ),
            ),
          ),
        ),
      ),
    );
  }

  let timer = null;
  search.addEventListener('input', () => {
    clearTimeout(timer);
    timer = setTimeout(() => select(kind, false), 250);
  });

  replace(
    main,
    h('h1', {}, 'Resources'),
    h(
      'form',
      {
        class: 'toolbar',
        role: 'search',
        onsubmit: (e) => {
          e.preventDefault();
          clearTimeout(timer);
          select(kind, false);
        },
      },
      h('label', { for: 'resource-search' }, 'Search by name, hostname or label'),
      search,
      h('button', { type: 'submit' }, 'Search'),
    ),
    h('div', { role: 'tablist', 'aria-label': 'Kind of resource', class: 'tabs' }, tabs),
    status,
    results,
  );
  syncTabs(false);
  await load();
  return () => clearTimeout(timer);
}
