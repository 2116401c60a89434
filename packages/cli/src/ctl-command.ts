// `edge-proxy ctl <operation>`: the control API for operators' scripts (docs/operations.md
// "edge-proxy ctl"). One request per run; the answer's JSON on stdout; on failure one line on
// stderr (status, reason, message, every configuration problem) and an exit status per kind of
// failure (CTL_EXIT), so a rollout script branches on `$?` instead of parsing text.
import type { Argv, CommandModule } from 'yargs';
// The one rule of a generation number, the control API's (a subpath: ctl does not load the supervisor).
import { MAX_GENERATION, isGenerationNumber } from '@edge-proxy/controlplane/generation-number';
import { call } from './ctl-client.ts';
import { parseAnswer } from './ctl-answer.ts';
import { CTL_EXIT, CTL_OPERATIONS, ACTIVATION_OPERATIONS, ctlRequest, exitForStatus, failureLine, oneLine, outcomeOf, problemLines } from './ctl-request.ts';
import type { CtlArgs, CtlOperation } from './ctl-request.ts';
import { CTL_ENV, resolveTarget } from './ctl-target.ts';
import type { TargetOptions } from './ctl-target.ts';
import type { Output } from './validate-command.ts';

/** Runs one operation; resolves with its exit status. `env` supplies the fallbacks (CTL_ENV). */
export async function ctlCommand(args: CtlArgs, options: TargetOptions, output: Output, env: NodeJS.ProcessEnv = process.env): Promise<number> {
  const op = args.operation;
  const resolved = await resolveTarget(options, env);
  if (!resolved.ok) {
    output.err(failureLine(op, undefined, 'usage', resolved.message));
    return CTL_EXIT.usage;
  }
  const result = await call(resolved.target, ctlRequest(args, resolved.paths));
  if (!result.ok) {
    output.err(failureLine(op, undefined, result.reason, `${resolved.target.url.origin}: ${result.message}`));
    return CTL_EXIT.unreachable;
  }
  const parsed = parseAnswer(result.text);
  if (!parsed.ok && parsed.problem === 'too_deep') {
    // Nested past the bound: nothing of it is printed; a 2xx is no usable answer, any other status says what it says.
    const exit = exitForStatus(result.status);
    output.err(failureLine(op, result.status, 'invalid_response', parsed.message));
    return exit === CTL_EXIT.ok ? CTL_EXIT.unreachable : exit;
  }
  const body = parsed.ok ? parsed.body : undefined;
  // The answer, whatever it says: a script reads the plan of a refused activation from it too.
  if (body !== undefined) output.out(JSON.stringify(body));
  const outcome = outcomeOf(op, result.status, body);
  if (outcome.exit !== CTL_EXIT.ok) output.err(failureLine(op, result.status, outcome.reason ?? 'failed', outcome.message ?? '', problemLines(body)));
  return outcome.exit;
}

/** A generation number of an option (the control API's rule), or the usage message. */
function generation(name: string, v: unknown): number | undefined | string {
  if (v === undefined) return undefined;
  return isGenerationNumber(v) ? v : `${name} must be a generation number (a whole number from 1 to ${MAX_GENERATION})`;
}

/** Longest `--timeout` (ms): the largest delay a Node timer keeps (a longer one fires at once). */
const MAX_TIMEOUT_MS = 2 ** 31 - 1;
/** Longest text option (characters): the control API's bound on a body's text fields. */
export const MAX_TEXT_OPTION_CHARS = 4096;

/** The problem of a text option, or undefined: bounded, and no control characters in a path. */
function textProblem(name: string, v: unknown): string | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== 'string' || v.length === 0) return `--${name} must be a non-empty text`;
  if (v.length > MAX_TEXT_OPTION_CHARS) return `--${name} is longer than ${MAX_TEXT_OPTION_CHARS} characters`;
  if (name !== 'reason' && name !== 'requested-by' && /\p{Cc}/u.test(v)) return `--${name} must not contain control characters`;
  return undefined;
}

const CONNECTION_OPTIONS = 'Connection (fallbacks: environment, then the -c file):';

/** The connection options every operation takes. */
function connectionOptions<T>(y: Argv<T>) {
  return y
    .option('url', { type: 'string', requiresArg: true, group: CONNECTION_OPTIONS, describe: `control API origin, https://HOST:PORT (env ${CTL_ENV.url})` })
    .option('config', { type: 'string', default: undefined, requiresArg: true, group: CONNECTION_OPTIONS, describe: "the service's configuration: control API address, port, certificate and reload paths (default /etc/edge-proxy/config.yaml when no URL is given)" })
    .option('token-file', { type: 'string', requiresArg: true, group: CONNECTION_OPTIONS, describe: `file holding the bearer token (env ${CTL_ENV.tokenFile})` })
    .option('ca', { type: 'string', requiresArg: true, group: CONNECTION_OPTIONS, describe: `PEM CA bundle that verifies the control API (env ${CTL_ENV.ca}); default with -c: the certificate the configuration names` })
    .option('cert', { type: 'string', requiresArg: true, group: CONNECTION_OPTIONS, describe: `client certificate for mTLS (env ${CTL_ENV.cert})` })
    .option('key', { type: 'string', requiresArg: true, group: CONNECTION_OPTIONS, describe: `key of the client certificate (env ${CTL_ENV.key})` })
    .option('servername', { type: 'string', requiresArg: true, group: CONNECTION_OPTIONS, describe: 'TLS server name to send and verify (default: the URL host)' })
    .option('insecure', { type: 'boolean', group: CONNECTION_OPTIONS, describe: "do not verify the control API's certificate" })
    .option('timeout', { type: 'number', requiresArg: true, group: CONNECTION_OPTIONS, describe: 'deadline of the whole call in ms (default 60000)' });
}

const ACTIVATION_OPTIONS = {
  'config-path': { type: 'string', requiresArg: true, describe: 'candidate file, as the service will read it (default: the active source)' },
  'expected-generation': { type: 'number', requiresArg: true, describe: 'refuse (exit 3) unless this generation is active' },
  reason: { type: 'string', requiresArg: true, describe: 'reason recorded in history' },
  'requested-by': { type: 'string', requiresArg: true, describe: 'note recorded beside the authenticated caller' },
} as const;

const ROLLBACK_OPTIONS = {
  to: { type: 'number', requiresArg: true, demandOption: true, describe: 'generation to restore' },
  'expected-active-generation': { type: 'number', requiresArg: true, describe: 'refuse (exit 3) unless this generation is active' },
  reason: ACTIVATION_OPTIONS.reason,
  'requested-by': ACTIVATION_OPTIONS['requested-by'],
} as const;

const DESCRIPTIONS: Record<CtlOperation, string> = {
  status: 'the runtime snapshot (GET /admin/runtime)',
  history: 'activation history, or one generation with N',
  validate: 'plan a candidate; exit 2 if invalid, 3 if activation would refuse it',
  preview: 'as validate, and record the plan in history',
  activate: 'activate a candidate (or the active source again)',
  reload: 'the legacy reload (the configured reload_path)',
  rollback: 'restore a retained generation (--to N)',
  'reload-certs': 'read listener and control API certificates again',
  restart: 'drain and restart the workers (admin)',
};

type Parsed = Record<string, unknown>;

/** Maps parsed arguments to CtlArgs and TargetOptions, or a usage message. */
export function argsOf(operation: CtlOperation, a: Parsed, defaultConfig: string): { args: CtlArgs; options: TargetOptions } | string {
  const numbers: Record<string, number | undefined> = {};
  for (const [name, key] of [['N', 'generation'], ['--to', 'to'], ['--expected-generation', 'expected-generation'], ['--expected-active-generation', 'expected-active-generation']] as const) {
    const n = generation(name, a[key]);
    if (typeof n === 'string') return n;
    numbers[key] = n;
  }
  const timeout = a['timeout'];
  if (timeout !== undefined && !(typeof timeout === 'number' && Number.isSafeInteger(timeout) && timeout >= 1 && timeout <= MAX_TIMEOUT_MS)) return `--timeout must be a whole number of ms from 1 to ${MAX_TIMEOUT_MS}`;
  numbers['timeout'] = timeout;
  for (const k of ['config-path', 'reason', 'requested-by', 'url', 'config', 'token-file', 'ca', 'cert', 'key', 'servername']) {
    const problem = textProblem(k, a[k]);
    if (problem !== undefined) return problem;
  }
  const str = (k: string): string | undefined => (typeof a[k] === 'string' ? a[k] : undefined);
  const args: CtlArgs = {
    operation,
    ...(numbers['generation'] === undefined ? {} : { generation: numbers['generation'] }),
    ...(numbers['to'] === undefined ? {} : { to: numbers['to'] }),
    ...(numbers['expected-generation'] === undefined ? {} : { expectedGeneration: numbers['expected-generation'] }),
    ...(numbers['expected-active-generation'] === undefined ? {} : { expectedActiveGeneration: numbers['expected-active-generation'] }),
    ...(str('config-path') === undefined ? {} : { configPath: str('config-path') }),
    ...(str('reason') === undefined ? {} : { reason: str('reason') }),
    ...(str('requested-by') === undefined ? {} : { requestedBy: str('requested-by') }),
  };
  const options: TargetOptions = {
    defaultConfig,
    insecure: a['insecure'] === true,
    ...(numbers['timeout'] === undefined ? {} : { timeoutMs: numbers['timeout'] }),
    ...Object.fromEntries(
      (
        [
          ['url', 'url'],
          ['config', 'config'],
          ['tokenFile', 'token-file'],
          ['ca', 'ca'],
          ['cert', 'cert'],
          ['key', 'key'],
          ['servername', 'servername'],
        ] as const
      )
        .filter(([, k]) => str(k) !== undefined)
        .map(([name, k]) => [name, str(k)]),
    ),
  };
  return { args, options };
}

/**
 * The `ctl` command for main.ts. Usage errors exit 1 here (CTL_EXIT.usage), not with the
 * validate command's status; `-c` has no default value so that an explicit one can be told apart.
 */
export function ctlModule(output: Output, defaultConfig: string): CommandModule {
  const usage = (msg: string): never => {
    output.err(oneLine(`edge-proxy ctl: ${msg} (see edge-proxy ctl --help)`));
    process.exit(CTL_EXIT.usage);
  };
  const run = async (operation: CtlOperation, a: Parsed): Promise<void> => {
    const mapped = argsOf(operation, a, defaultConfig);
    if (typeof mapped === 'string') return usage(mapped);
    process.exitCode = await ctlCommand(mapped.args, mapped.options, output);
  };
  return {
    command: 'ctl',
    describe: 'call the control API (for scripts: JSON on stdout, exit status per outcome)',
    builder: (y) => {
      let b = connectionOptions(y)
        .usage('$0 ctl <operation> [options]\n\nExit status: 0 success; 1 usage or no answer; 2 invalid (400); 3 conflict (409); 4 authentication or role (401/403); 5 not found (404); 6 server failure (5xx).')
        .fail((msg, err) => usage(msg ?? err?.message ?? 'invalid arguments'))
        .demandCommand(1, 'name an operation')
        .strict();
      for (const op of CTL_OPERATIONS) {
        const command = op === 'history' ? 'history [generation]' : op;
        const options = ACTIVATION_OPERATIONS.includes(op) ? ACTIVATION_OPTIONS : op === 'rollback' ? ROLLBACK_OPTIONS : {};
        b = b.command(
          command,
          DESCRIPTIONS[op],
          (c) => (op === 'history' ? c.positional('generation', { type: 'number', describe: 'one generation (N)' }) : c).options(options),
          (a) => run(op, a as Parsed),
        );
      }
      return b;
    },
    handler: () => undefined,
  };
}
