// Every cross-field rule, in the order they run. Each is named; all run on every document.
import type { Rule } from './context.ts';
import { LISTENER_RULES } from './listeners.ts';
import { UPSTREAM_RULES } from './upstreams.ts';
import { RESILIENCE_RULES } from './resilience.ts';
import { CONTROL_PLANE_RULES } from './control-plane.ts';

export const ALL_RULES: readonly Rule[] = [...LISTENER_RULES, ...UPSTREAM_RULES, ...RESILIENCE_RULES, ...CONTROL_PLANE_RULES];
export type { Rule, RuleContext } from './context.ts';
