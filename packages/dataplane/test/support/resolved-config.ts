// A configuration as a data plane under test takes it: validated and resolved as the supervisor
// would (relative paths against /tmp), with no listener (the tests drive the request path, not
// sockets). Throws with the issues when the configuration is not valid.
import { resolveConfig, validateConfig } from '@edge-proxy/config';
import type { ResolvedConfig } from '@edge-proxy/config';

export async function resolvedForTest(raw: Record<string, unknown>): Promise<ResolvedConfig> {
  const v = validateConfig(raw, '/tmp');
  if (!v.ok) throw new Error(JSON.stringify(v.issues));
  const resolved = await resolveConfig({ ...v.value, config: { ...v.value.config, listeners: [] } });
  if (!resolved.ok) throw new Error(JSON.stringify(resolved.issues));
  return resolved.value;
}
