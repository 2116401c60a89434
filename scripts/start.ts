// `npm start`: prepares the development state (a self-signed certificate under .edge-proxy/, made
// once) and hands the development config to the edge-proxy command.
import { existsSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { makeLeaf } from './lib/certs.ts';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const tlsDir = path.join(root, '.edge-proxy', 'tls');
if (!existsSync(path.join(tlsDir, 'server.crt'))) {
  makeLeaf(tlsDir, 'server', undefined, { sans: ['localhost', '127.0.0.1', '::1'], days: 365 });
  console.log(`created a self-signed development certificate in ${path.relative(root, tlsDir)}/`);
}
const args = process.argv.slice(2);
const result = spawnSync(process.execPath, [path.join(root, 'packages/cli/src/main.ts'), ...(args.length > 0 ? args : ['-c', path.join(root, 'deploy/config.dev.yaml')])], { stdio: 'inherit' });
process.exit(result.status ?? 1);
