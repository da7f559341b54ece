// xterm.js writes its renderer's CSS into <style> elements and a few cell colours into `style`
// attributes. The Proxy Service's Content Security Policy (`style-src 'self'`, no
// 'unsafe-inline') refuses both. This shim keeps the policy strict and xterm.js working:
// - `<style>` elements the page creates become inert `<svc-style>` elements whose text is mirrored
//   into a constructed stylesheet (document.adoptedStyleSheets), which the policy does not govern;
// - `setAttribute('style', …)` is applied through the CSSOM (`element.style.cssText`), which it
//   allows too.
// Nothing else in the app creates styles at run time: the app's own CSS is a file under /web/.

const textContent = Object.getOwnPropertyDescriptor(Node.prototype, 'textContent');

class SvcStyle extends HTMLElement {
  constructor() {
    super();
    this.sheet = new CSSStyleSheet();
  }

  connectedCallback() {
    if (!document.adoptedStyleSheets.includes(this.sheet)) {
      document.adoptedStyleSheets = [...document.adoptedStyleSheets, this.sheet];
    }
  }

  disconnectedCallback() {
    document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => s !== this.sheet);
  }

  get textContent() {
    return textContent.get.call(this);
  }

  set textContent(css) {
    textContent.set.call(this, css);
    this.sheet.replaceSync(String(css ?? ''));
  }
}

let installed = false;

/** Installs the shim (once); call before creating an xterm.js Terminal. */
export function installCspShim() {
  if (installed) return;
  installed = true;
  customElements.define('svc-style', SvcStyle);
  const createElement = Document.prototype.createElement;
  document.createElement = function (tag, options) {
    if (String(tag).toLowerCase() === 'style') return createElement.call(this, 'svc-style', options);
    return createElement.call(this, tag, options);
  };
  const setAttribute = Element.prototype.setAttribute;
  Element.prototype.setAttribute = function (name, value) {
    if (String(name).toLowerCase() === 'style' && this instanceof HTMLElement) {
      this.style.cssText = String(value);
      return;
    }
    setAttribute.call(this, name, value);
  };
}
