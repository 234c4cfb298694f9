// ESLint for the extension's TypeScript (npm run lint; scripts/test.sh runs it): the recommended
// rules of ESLint and typescript-eslint, `any` refused, and no value read untyped: an `any` (what
// JSON.parse returns, say) may not be assigned, passed, returned, called or read into
// (the no-unsafe rules, with the types of tsconfig.test.json: the sources and their tests).
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['lib/**', 'node_modules/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['src/**/*.ts', 'test/**/*.ts'],
    languageOptions: {
      parserOptions: { project: './tsconfig.test.json', tsconfigRootDir: import.meta.dirname }
    },
    rules: {
      '@typescript-eslint/no-explicit-any': 'error',
      '@typescript-eslint/no-unsafe-argument': 'error',
      '@typescript-eslint/no-unsafe-assignment': 'error',
      '@typescript-eslint/no-unsafe-call': 'error',
      '@typescript-eslint/no-unsafe-member-access': 'error',
      '@typescript-eslint/no-unsafe-return': 'error',
      eqeqeq: ['error', 'smart']
    }
  }
);
