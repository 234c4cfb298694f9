// The extension's unit tests (npm test; scripts/test.sh runs them): the panel's and status bar's
// words, in a bare DOM (jsdom), without JupyterLab.
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: { environment: 'jsdom', include: ['test/**/*.test.ts'], setupFiles: ['test/setup.ts'] }
});
