// ESLint for the extension's TypeScript (npm run lint; scripts/test.sh runs it): the recommended
// rules of ESLint and typescript-eslint, `any` refused.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['lib/**', 'node_modules/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['src/**/*.ts', 'test/**/*.ts'],
    rules: {
      '@typescript-eslint/no-explicit-any': 'error',
      eqeqeq: ['error', 'smart']
    }
  }
);
