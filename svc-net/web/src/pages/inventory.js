import { query, request } from '../api.js';
import { h, notice, replace, when } from '../dom.js';


/**
 * Every agent with its version, updater and maintenance state, filterable as `tctl inventory
 * ls` is; agents behind the cluster's version are highlighted.
 */
export async function inventoryPage(main, { params }) {
  const results = h('div', { id: 'inventory-results', 'aria-live': 'polite' });
  const upgrader = h(
    'select',
    { id: 'f-upgrader', name: 'upgrader' },
    h('option', { value: '' }, 'any'),
    ['unit', 'kube', 'none'].map((u) => h('option', { value: u }, u)),
  );
  upgrader.value = params.get('upgrader') || '';
  const text = (name, label, placeholder) => {
    const input = h('input', { id: `f-${name}`, name, placeholder, value: params.get(name) || '' });
    return [h('div', { class: 'field' }, h('label', { for: `f-${name}` }, label), input), input];
  };
  const [olderField, older] = text('older_than', 'Older than', 'e.g. 17.0.0');
  const [newerField, newer] = text('newer_than', 'Newer than', 'e.g. 16.0.0');
  const [exactField, exact] = text('exact_version', 'Exact version', 'e.g. 17.0.0');
  const [servicesField, services] = text('services', 'Services', 'e.g. node,app');

  function filters() {
    return {
      upgrader: upgrader.value,
      older_than: older.value,
      newer_than: newer.value,
      exact_version: exact.value,
      services: services.value,
    };
  }

  async function load() {
    replace(results, notice('info', 'Loading…'));
    const q = query(filters());
    history.replaceState(null, '', `/web/inventory${q}`);
    let data;
    try {
      data = await request('GET', `/webapi/inventory${q}`);
    } catch (e) {
      replace(results, notice('error', e.message));
      return;
    }
    const items = data.items || [];
    const behind = items.filter((i) => i.behind).length;
    replace(
      results,
      h(
        'p',
        { class: 'summary' },
        `Cluster version ${data.cluster_version}. ${items.length} agent${items.length === 1 ? '' : 's'}`,
        behind ? `, ${behind} behind the cluster's version.` : '.',
      ),
      items.length === 0
        ? notice('info', 'No agent matches these filters.')
        : h(
            'div',
            { class: 'table-wrap' },
            h(
              'table',
              { id: 'inventory' },
              h('caption', { class: 'visually-hidden' }, 'Agents'),
              h(
                'thead',
                {},
                h(
                  'tr',
                  {},
                  ['Host ID', 'Hostname', 'Services', 'Version', 'Upgrader', 'Last update', 'Next window'].map((c) => h('th', { scope: 'col' }, c)),
                ),
              ),
              h(
                'tbody',
                {},
                items.map((i) =>
                  h(
                    'tr',
                    { class: i.behind ? 'behind' : '', 'data-server-id': i.server_id },
                    h('td', { class: 'mono' }, i.server_id),
                    h('th', { scope: 'row' }, i.hostname),
                    h('td', {}, (i.services || []).join(', ')),
                    h('td', {}, i.version, i.behind ? [' ', h('strong', { class: 'badge warn' }, 'behind')] : null),
                    h('td', {}, i.upgrader, i.upgrader_version ? ` ${i.upgrader_version}` : ''),
                    h('td', {}, i.last_update ?? h('span', { class: 'muted' }, 'none')),
                    h('td', {}, when(i.next_window)),
                  ),
                ),
              ),
            ),
          ),
    );
  }

  replace(
    main,
    h('h1', {}, 'Inventory'),
    h(
      'form',
      {
        class: 'filters',
        'aria-label': 'Filters',
        onsubmit: (e) => {
          e.preventDefault();
          load();
        },
      },
      h('div', { class: 'field' }, h('label', { for: 'f-upgrader' }, 'Upgrader'), upgrader),
      olderField,
      newerField,
      exactField,
      servicesField,
      h('div', { class: 'field actions' }, h('button', { type: 'submit' }, 'Apply filters'), h('button', {
        type: 'button',
        class: 'secondary',
        onclick: () => {
          upgrader.value = '';
          for (const i of [older, newer, exact, services]) i.value = '';
          load();
        },
      }, 'Clear')),
    ),
    results,
  );
  await load();
}
