// Regenerates the generated documentation (`npm run docs`): docs/configuration.md from the config
// schema and docs/errors.md from every package's error registry. A test fails when either is stale.
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { renderErrorsDoc, renderReferenceDoc } from './lib/docs.ts';

const docs = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../docs');
writeFileSync(path.join(docs, 'configuration.md'), renderReferenceDoc());
writeFileSync(path.join(docs, 'errors.md'), renderErrorsDoc());
console.log(`wrote ${path.join(docs, 'configuration.md')} and ${path.join(docs, 'errors.md')}`);
