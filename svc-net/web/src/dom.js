// A small element builder: text always goes in as text nodes (never parsed as HTML).

/**
 * Creates `<tag>` with `attrs` (`class`, `for`, `on<event>` handlers, booleans, anything else as
 * attributes) and `children` (strings, nodes, arrays, null/false skipped).
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') {
      el.addEventListener(k.slice(2), v);
    } else if (k === 'class') {
      el.className = v;
    } else if (k === 'value') {
      el.value = v;
    } else if (v === true) {
      el.setAttribute(k, '');
    } else {
      el.setAttribute(k, String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** Replaces the children of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

/** A message box: `role=alert` for errors, `role=status` otherwise. */
export function notice(kind, text) {
  return h('p', { class: `notice ${kind}`, role: kind === 'error' ? 'alert' : 'status' }, text);
}

/** Formats an RFC 3339 time for people (local time, with the UTC original as a title). */
export function when(rfc3339) {
  if (!rfc3339) return h('span', { class: 'muted' }, 'none');
  const d = new Date(rfc3339);
  if (Number.isNaN(d.getTime())) return rfc3339;
  return h('time', { datetime: rfc3339, title: rfc3339 }, d.toLocaleString());
}
