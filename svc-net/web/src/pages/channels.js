import { request } from '../api.js';
import { h, notice, replace } from '../dom.js';

/** Version channels: each channel's current version and whether it is critical. */
export async function channelsPage(main) {
  replace(main, h('h1', {}, 'Version channels'), notice('info', 'Loading…'));
  let data;
  try {
    data = await request('GET', '/webapi/channels');
  } catch (e) {
    replace(main, h('h1', {}, 'Version channels'), notice('error', e.message));
    return;
  }
  const channels = data.channels || [];
  replace(
    main,
    h('h1', {}, 'Version channels'),
    channels.length === 0
      ? notice('info', 'No version channels are configured.')
      : h(
          'div',
          { class: 'table-wrap' },
          h(
            'table',
            { id: 'channels' },
            h('caption', { class: 'visually-hidden' }, 'Version channels'),
            h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Channel'), h('th', { scope: 'col' }, 'Version'), h('th', { scope: 'col' }, 'Critical'))),
            h(
              'tbody',
              {},
              channels.map((c) =>
                h(
                  'tr',
                  { class: c.critical ? 'critical' : '' },
                  h('th', { scope: 'row' }, c.name),
                  h('td', {}, c.version),
                  h('td', {}, c.critical ? h('strong', { class: 'badge warn' }, 'critical') : 'no'),
                ),
              ),
            ),
          ),
        ),
  );
}
