import { request } from '../api.js';
import { h, notice, replace, when } from '../dom.js';

const DAYS = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];
const DAY_NAMES = {
  Sun: 'Sunday',
  Mon: 'Monday',
  Tue: 'Tuesday',
  Wed: 'Wednesday',
  Thu: 'Thursday',
  Fri: 'Friday',
  Sat: 'Saturday',
};

/** The first three letters of a weekday as svc writes it ("Monday", "mon" → "Mon"). */
function shortDay(d) {
  const s = String(d).slice(0, 3).toLowerCase();
  return s.charAt(0).toUpperCase() + s.slice(1);
}

function describe(window) {
  if (!window) return 'No maintenance window is configured: agents with an updater are not updated automatically.';
  const days = (window.weekdays || []).map(shortDay);
  const hour = String(window.utc_start_hour).padStart(2, '0');
  const on = days.length === 0 ? 'every day' : days.map((d) => DAY_NAMES[d] || d).join(', ');
  return `Agents may be updated from ${hour}:00 UTC for one hour, ${on}.`;
}

/**
 * The cluster's maintenance window, shown to everyone who may read it. Saving sends the whole
 * document back; whether the user may change it is the Auth Service's decision, shown as it
 * answers.
 */
export async function maintenancePage(main) {
  replace(main, h('h1', {}, 'Maintenance'), notice('info', 'Loading…'));
  let doc;
  try {
    doc = await request('GET', '/webapi/maintenance');
  } catch (e) {
    replace(main, h('h1', {}, 'Maintenance'), notice('error', e.message));
    return;
  }
  const window = doc.spec && doc.spec.agent_upgrades;
  const current = h('p', { id: 'maintenance-current' }, describe(window));
  const next = h('p', { id: 'maintenance-next' }, 'Next window: ', when(doc.next_window));
  const status = h('div', { class: 'notice-slot', 'aria-live': 'polite' });

  const enabled = h('input', { id: 'm-enabled', type: 'checkbox' });
  enabled.checked = !!window;
  const hour = h(
    'select',
    { id: 'm-hour' },
    Array.from({ length: 24 }, (_, i) => h('option', { value: String(i) }, `${String(i).padStart(2, '0')}:00 UTC`)),
  );
  hour.value = String(window ? window.utc_start_hour : 0);
  const selected = new Set((window && window.weekdays ? window.weekdays : []).map(shortDay));
  const dayBoxes = DAYS.map((d) => {
    const box = h('input', { type: 'checkbox', id: `m-day-${d}`, value: d });
    box.checked = selected.has(d);
    return [box, h('label', { for: `m-day-${d}`, class: 'inline' }, DAY_NAMES[d])];
  });
  const save = h('button', { type: 'submit' }, 'Save');

  const form = h(
    'form',
    {
      class: 'card',
      id: 'maintenance-form',
      'aria-labelledby': 'm-edit-title',
      onsubmit: async (e) => {
        e.preventDefault();
        replace(status);
        save.disabled = true;
        const body = { ...doc };
        delete body.next_window;
        body.spec = { ...(doc.spec || {}) };
        if (enabled.checked) {
          body.spec.agent_upgrades = {
            utc_start_hour: Number(hour.value),
            weekdays: dayBoxes.filter(([b]) => b.checked).map(([b]) => b.value),
          };
        } else {
          delete body.spec.agent_upgrades;
        }
        try {
          await request('PUT', '/webapi/maintenance', body);
          const fresh = await request('GET', '/webapi/maintenance');
          doc = fresh;
          replace(current, describe(fresh.spec && fresh.spec.agent_upgrades));
          replace(next, 'Next window: ', when(fresh.next_window));
          replace(status, notice('success', 'Saved.'));
        } catch (err) {
          const why = err.status === 403 ? 'The Auth Service refused the change' : 'Not saved';
          replace(status, notice('error', `${why}: ${err.message}`));
        } finally {
          save.disabled = false;
        }
      },
    },
    h('h2', { id: 'm-edit-title' }, 'Change the window'),
    h('p', { class: 'muted' }, 'Whether you may change it is decided by your roles when you save.'),
    h('div', { class: 'check' }, enabled, h('label', { for: 'm-enabled', class: 'inline' }, 'Update agents in a maintenance window')),
    h('div', { class: 'field' }, h('label', { for: 'm-hour' }, 'Start hour'), hour),
    h('fieldset', {}, h('legend', {}, 'Days (none checked means every day)'), dayBoxes.map(([b, l]) => h('div', { class: 'check' }, b, l))),
    status,
    save,
  );

  replace(main, h('h1', {}, 'Maintenance'), h('section', { class: 'card', 'aria-label': 'Current window' }, current, next), form);
}
