#!/usr/bin/env node
// The `edge-proxy` command. Holds no logic of its own: it parses arguments and calls the packages.
import { readFileSync } from 'node:fs';
import yargs from 'yargs';
import { DEFAULT_CONFIG_PATH } from '@edge-proxy/config';
import { EXIT_USAGE, validateCommand } from './validate-command.ts';
import { ctlModule } from './ctl-command.ts';

const { version } = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };
const output = { out: (l: string) => process.stdout.write(`${l}\n`), err: (l: string) => process.stderr.write(`${l}\n`) };

const parser = yargs(process.argv.slice(2))
  .scriptName('edge-proxy')
  .usage('$0 [-c FILE]\n\nValidates FILE and exits 0 when it is valid, 1 with one line per error when not.')
  .option('config', { alias: 'c', type: 'string', default: DEFAULT_CONFIG_PATH, describe: 'configuration file', requiresArg: true })
  .command('$0', 'validate the configuration', () => {}, async (argv) => {
    process.exitCode = await validateCommand(argv.config, output);
  })
  .command(
    'serve',
    'run the service (supervisor and workers)',
    (y) =>
      y
        .option('state-dir', { type: 'string', describe: 'state directory (default $STATE_DIRECTORY, else /var/lib/edge-proxy)', requiresArg: true })
        .option('force-config', { type: 'boolean', default: false, describe: 'start from -c FILE even when the state directory holds an activated generation to resume (history is kept)' }),
    async (argv) => {
      // Loaded here: the supervisor and the data plane are most of the command's start-up time,
      // which `ctl` (called in loops by rollout scripts) does not need.
      const { serveCommand } = await import('./serve-command.ts');
      process.exitCode = await serveCommand(argv.config, output, argv['state-dir'], argv['force-config']);
    },
  )
  .command(ctlModule(output, DEFAULT_CONFIG_PATH))
  .version(version)
  .alias('version', 'V')
  .help()
  .alias('help', 'h')
  .strict()
  .fail((msg, err) => {
    output.err(`edge-proxy: ${msg ?? err?.message ?? 'invalid arguments'}`);
    output.err("Try 'edge-proxy --help'.");
    process.exit(EXIT_USAGE);
  });

await parser.parseAsync();
