// Which process holds which socket, read from /proc (Linux): a listener "bound by every worker" is
// checked against each worker's own file descriptors, not inferred from answers that any one worker
// could give.
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';

/** Inodes of the sockets bound to local `port` in /proc/net/<table> (TCP: listening ones only). */
function inodes(table: 'tcp' | 'tcp6' | 'udp' | 'udp6', port: number): Set<string> {
  const out = new Set<string>();
  let text: string;
  try {
    text = readFileSync(`/proc/net/${table}`, 'utf8');
  } catch {
    return out;
  }
  const hexPort = port.toString(16).toUpperCase().padStart(4, '0');
  for (const line of text.split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    const local = f[1];
    const state = f[3];
    const inode = f[9];
    if (local === undefined || inode === undefined || !local.endsWith(`:${hexPort}`)) continue;
    if (table.startsWith('tcp') && state !== '0A') continue; // 0A: LISTEN
    out.add(inode);
  }
  return out;
}

/** Whether process `pid` holds a listening TCP socket and a UDP socket on `port`. */
export function holdsPort(pid: number, port: number): { tcp: boolean; udp: boolean } {
  const tcp = new Set([...inodes('tcp', port), ...inodes('tcp6', port)]);
  const udp = new Set([...inodes('udp', port), ...inodes('udp6', port)]);
  const held = { tcp: false, udp: false };
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    let target: string;
    try {
      target = readlinkSync(`/proc/${pid}/fd/${fd}`);
    } catch {
      continue; // closed meanwhile
    }
    const m = /^socket:\[(\d+)\]$/.exec(target);
    if (m === null) continue;
    if (tcp.has(m[1] as string)) held.tcp = true;
    if (udp.has(m[1] as string)) held.udp = true;
  }
  return held;
}
