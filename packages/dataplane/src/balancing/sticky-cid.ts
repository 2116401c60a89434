// Sticky by connection: every request of one downstream connection goes to the same backend while
// it is usable. On QUIC the affinity key is the connection id the client chose at the handshake
// (stable across migration); on the TLS bootstrap path, which has no connection id, it is the TCP
// peer `address:port` of the connection (docs/decisions.md). Consistent hashing keeps most
// connections on their backend when the backend set changes.
import { ConsistentHashSelector } from './consistent-hash.ts';
import type { BackendRef, PickContext } from './selector.ts';

export class StickyCidSelector extends ConsistentHashSelector {
  override readonly strategy = 'sticky-cid';

  constructor(backends: readonly BackendRef[]) {
    super(backends);
  }

  override pick(ctx: PickContext): BackendRef | undefined {
    return this.pickByKey(ctx.affinityKey ?? '', ctx);
  }
}
