// `npm start`: the proxy on a working default. Creates a self-signed development certificate under
// .edge-proxy/ (once), starts a tiny demo backend on 127.0.0.1:9898, and runs
// `edge-proxy serve -c deploy/config.dev.yaml`. Ctrl-C stops both.
//   curl -k https://localhost:9889/        (HTTP/1.1 or HTTP/2 through the TLS bootstrap ingress)
//   gtlsclient 127.0.0.1 9889 https://localhost:9889/   (HTTP/3)
//   curl -k -H "Authorization: Bearer $(cat .edge-proxy/admin.token)" https://127.0.0.1:9443/admin/runtime
import { existsSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { makeLeaf } from './lib/certs.ts';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const tlsDir = path.join(root, '.edge-proxy', 'tls');
if (!existsSync(path.join(tlsDir, 'server.crt'))) {
  makeLeaf(tlsDir, 'server', undefined, { sans: ['localhost', '127.0.0.1', '::1'], days: 365 });
  console.log(`created a self-signed development certificate in ${path.relative(root, tlsDir)}/`);
}
const tokenFile = path.join(root, '.edge-proxy', 'admin.token');
if (!existsSync(tokenFile)) {
  writeFileSync(tokenFile, `${randomBytes(24).toString('hex')}\n`, { mode: 0o600 });
  console.log(`created a random control API admin token in ${path.relative(root, tokenFile)}`);
}
const args = process.argv.slice(2);
if (args.length > 0) {
  // `npm start -- -c FILE` etc.: pass through to the command (validation, or serve).
  const r = spawn(process.execPath, [path.join(root, 'packages/cli/src/main.ts'), ...args], { stdio: 'inherit' });
  r.on('exit', (code) => process.exit(code ?? 1));
} else {
  const demo = http.createServer((req, res) => {
    const body = JSON.stringify({ service: 'demo backend', method: req.method, path: req.url, via: req.headers['via'] ?? null, forwarded: req.headers['forwarded'] ?? null }, null, 2);
    res.writeHead(200, { 'content-type': 'application/json' }).end(`${body}\n`);
  });
  demo.on('error', (err: NodeJS.ErrnoException) => {
    console.error(err.code === 'EADDRINUSE' ? 'port 9898 (demo backend) is in use: is another `npm start` running?' : `demo backend: ${err.message}`);
    process.exit(1);
  });
  demo.listen(9898, '127.0.0.1', () => {
    console.log('demo backend on http://127.0.0.1:9898');
    console.log('try:  curl -k https://localhost:9889/');
    console.log('      curl -k -H "Authorization: Bearer $(cat .edge-proxy/admin.token)" https://127.0.0.1:9443/admin/runtime');
    const proxy = spawn(process.execPath, [path.join(root, 'packages/cli/src/main.ts'), 'serve', '-c', path.join(root, 'deploy/config.dev.yaml'), '--state-dir', path.join(root, '.edge-proxy/state')], { stdio: 'inherit' });
    const stop = (): void => {
      proxy.kill('SIGTERM');
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
    proxy.on('exit', (code) => {
      demo.close();
      process.exit(code ?? 0);
    });
  });
}
