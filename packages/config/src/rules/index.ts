// Every cross-field rule, in the order they run. Each is named; all run on every document.
import type { Rule } from './context.ts';
import { LISTENER_RULES } from './listeners.ts';
import { UPSTREAM_RULES } from './upstreams.ts';
import { RESILIENCE_RULES } from './resilience.ts';
import { CONTROL_PLANE_RULES } from './control-plane.ts';
import { PROCESS_RULES } from './process.ts';
import { unbuiltFeatureIssues } from '../features.ts';

/** Features the service does not carry out yet are refused when turned on (fail closed). */
const notBuilt: Rule = { name: 'not-built-features', check: (ctx) => unbuiltFeatureIssues(ctx.doc) };

export const ALL_RULES: readonly Rule[] = [...LISTENER_RULES, ...UPSTREAM_RULES, ...RESILIENCE_RULES, ...CONTROL_PLANE_RULES, ...PROCESS_RULES, notBuilt];
export type { Rule, RuleContext } from './context.ts';
