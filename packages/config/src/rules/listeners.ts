// Listener rules: presence, addresses, duplicate binds and names, TLS identity shape, SNI names.
import net from 'node:net';
import { issue } from '../errors.ts';
import type { ConfigIssue } from '../errors.ts';
import { effectiveListeners, listenerName } from '../normalize.ts';
import { bindsOverlap, isDnsName, itemsOf, repeats } from './context.ts';
import type { Rule, RuleContext } from './context.ts';
import type { ListenerConfig } from '../schema/listener.ts';

/** The effective listeners with the document path each came from. */
export function listenersWithPaths(ctx: RuleContext): { l: ListenerConfig; at: string }[] {
  const usesList = Array.isArray(ctx.doc.listeners) && ctx.doc.listeners.length > 0;
  return itemsOf(effectiveListeners(ctx.doc)).map((l, i) => ({ l, at: usesList ? `listeners[${i}]` : 'listen' }));
}

export const listenerPresent: Rule = {
  name: 'listener-present',
  check: (ctx) => (effectiveListeners(ctx.doc).length === 0 ? [issue('listen', 'EDGE_CONFIG_NO_LISTENER', 'configure `listen` or a non-empty `listeners` list')] : []),
};

export const listenerAddresses: Rule = {
  name: 'listener-addresses',
  check: (ctx) =>
    listenersWithPaths(ctx)
      .filter(({ l }) => typeof l.address === 'string' && net.isIP(l.address) === 0)
      .map(({ l, at }) => issue(`${at}.address`, 'EDGE_CONFIG_INVALID_IP', `'${l.address}' is not an IPv4 or IPv6 address`)),
};

export const listenerBindsUnique: Rule = {
  name: 'listener-binds-unique',
  check: (ctx) => {
    const out: ConfigIssue[] = [];
    const seen = listenersWithPaths(ctx);
    seen.forEach(({ l, at }, i) => {
      const clash = seen.slice(0, i).find((o) => o.l.port === l.port && bindsOverlap(o.l.address, l.address));
      if (clash !== undefined) out.push(issue(at, 'EDGE_CONFIG_DUPLICATE_BIND', `binds ${l.address}:${l.port}, which overlaps ${clash.at} (${clash.l.address}:${clash.l.port})`));
    });
    return out;
  },
};

export const listenerNamesUnique: Rule = {
  name: 'listener-names-unique',
  check: (ctx) => {
    const all = listenersWithPaths(ctx);
    return repeats(all, ({ l }) => (typeof l.address === 'string' ? listenerName(l) : undefined)).map(({ item, firstIndex }) =>
      issue(`${item.at}.name`, 'EDGE_CONFIG_DUPLICATE_LISTENER_NAME', `listener name '${listenerName(item.l)}' is also used by ${all[firstIndex]?.at ?? ''}`),
    );
  },
};

export const listenerTlsIdentity: Rule = {
  name: 'listener-tls-identity',
  check: (ctx) => {
    const out: ConfigIssue[] = [];
    for (const { l, at } of listenersWithPaths(ctx)) {
      const tls = l.tls;
      if (tls === null || typeof tls !== 'object') continue;
      const hasCert = tls.cert !== undefined;
      const hasKey = tls.key !== undefined;
      if (hasCert !== hasKey) {
        out.push(issue(`${at}.tls.${hasCert ? 'key' : 'cert'}`, 'EDGE_CONFIG_TLS_PARTIAL_PAIR', '`cert` and `key` must be given together'));
      } else if (!hasCert && itemsOf(tls.certificates).length === 0) {
        out.push(issue(`${at}.tls`, 'EDGE_CONFIG_TLS_NO_IDENTITY', 'give `cert` and `key`, or at least one `certificates[]` entry'));
      }
    }
    return out;
  },
};

export const listenerServerNames: Rule = {
  name: 'listener-server-names',
  check: (ctx) => {
    const out: ConfigIssue[] = [];
    for (const { l, at } of listenersWithPaths(ctx)) {
      const certs = itemsOf(l.tls?.certificates);
      const valid = (name: unknown): name is string => typeof name === 'string' && isDnsName(name, false);
      certs.forEach((c, i) => {
        if (typeof c?.server_name === 'string' && !valid(c.server_name)) {
          out.push(issue(`${at}.tls.certificates[${i}].server_name`, 'EDGE_CONFIG_TLS_SERVER_NAME_INVALID', `'${c.server_name}' is not an exact DNS name (no wildcards, no IP addresses)`));
        }
      });
      for (const { item, index, firstIndex } of repeats(certs, (c) => (valid(c?.server_name) ? c.server_name.toLowerCase() : undefined))) {
        out.push(issue(`${at}.tls.certificates[${index}].server_name`, 'EDGE_CONFIG_TLS_SERVER_NAME_DUPLICATE', `'${item.server_name}' is also used by certificates[${firstIndex}]`));
      }
    }
    return out;
  },
};

export const LISTENER_RULES: readonly Rule[] = [listenerPresent, listenerAddresses, listenerBindsUnique, listenerNamesUnique, listenerTlsIdentity, listenerServerNames];
