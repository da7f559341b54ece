// Builds the Web UI into dist/, which svc-net embeds in the binary (svc-net/build.rs).
// Everything is served by the Proxy Service under /web/ with a strict Content Security Policy:
// no inline scripts or styles, no external fonts or CDNs.
import { defineConfig } from 'vite';

export default defineConfig({
  base: '/web/',
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    // The polyfill would be an inline script, which the policy refuses.
    modulePreload: { polyfill: false },
    assetsInlineLimit: 0,
    sourcemap: false,
  },
});
