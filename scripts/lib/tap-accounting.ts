// Counts a tap run from its TAP 14 output, file by file, so that no failure hides in tap's own
// summary line. tap's summary counts failed assertions but not every abnormal end of a test file:
// a file killed by a signal after passing assertions sums up as passing, a file that registers no
// tests is a skip, and a file cut short by the timeout may lose the result line of another file.
// Here every file that crashed, was killed, timed out, registered no tests or reported no result
// is one failure of its own, named, on top of the failed assertions inside it.
//
// The stream, as tap 21 writes it: each file is a subtest at column 0 (`# Subtest: <file>`, its
// lines indented by 4 per level, then `ok N - <file>` or `not ok N - <file>` at column 0 and a YAML
// block carrying `exitCode` and `signal`); a file that exceeds the timeout also gets a column-0
// `not ok N - timeout!` whose YAML names it in `expired`.

export interface FileProblem {
  readonly file: string;
  readonly reason: string;
}

export interface TapAccount {
  /** Passing leaf assertions. */
  readonly passed: number;
  /** Failing leaf assertions, failing subtests with no failing assertion inside, and one per abnormal file. */
  readonly failed: number;
  /** Skipped and todo assertions. */
  readonly skipped: number;
  /** Every file that failed, with why: abnormal ends and files with failing assertions. */
  readonly problems: readonly FileProblem[];
}

interface Open {
  readonly indent: number;
  readonly name: string;
  failingLeaves: number;
}

interface FileFacts {
  failures: number;
  exitCode: number | null;
  signal: string | null;
  noTests: boolean;
  expired: boolean;
  reported: boolean;
}

const SUBTEST = /^( *)# Subtest: (.*)$/;
const RESULT = /^( *)(not )?ok \d+ - (.*?)(?: # (SKIP|TODO)\b(.*))?(?: # time=[\d.]+m?s)?$/i;
const NO_TESTS = /^ *1\.\.0 # no tests found/;

/** The YAML block that follows the line at `i` (indented `indent + 2`): its top-level scalar fields. */
function yamlAfter(lines: readonly string[], i: number, indent: number): { fields: Map<string, string>; end: number } {
  const fields = new Map<string, string>();
  const pad = ' '.repeat(indent + 2);
  if (lines[i + 1] !== `${pad}---`) return { fields, end: i };
  let j = i + 2;
  for (; j < lines.length && lines[j] !== `${pad}...`; j++) {
    const m = new RegExp(`^${pad}([A-Za-z]+): (.*)$`).exec(lines[j] ?? '');
    if (m !== null) fields.set(m[1] as string, (m[2] as string).trim());
  }
  return { fields, end: j };
}

function nullable(v: string | undefined): string | null {
  return v === undefined || v === 'null' ? null : v;
}

export function accountTap(output: string): TapAccount {
  const lines = output.split('\n');
  const stack: Open[] = [];
  const files = new Map<string, FileFacts>();
  const fileOf = (name: string): FileFacts => {
    let f = files.get(name);
    if (f === undefined) {
      f = { failures: 0, exitCode: null, signal: null, noTests: false, expired: false, reported: false };
      files.set(name, f);
    }
    return f;
  };
  let passed = 0;
  let failed = 0;
  let skipped = 0;
  const currentFile = (): FileFacts | undefined => (stack[0] !== undefined && stack[0].indent === 0 ? fileOf(stack[0].name) : undefined);

  for (let i = 0; i < lines.length; i++) {
    const line = lines[i] as string;
    const sub = SUBTEST.exec(line);
    if (sub !== null) {
      const indent = (sub[1] as string).length;
      while (stack.length > 0 && (stack[stack.length - 1] as Open).indent >= indent) stack.pop(); // a block that never reported
      stack.push({ indent, name: sub[2] as string, failingLeaves: 0 });
      if (indent === 0) fileOf(sub[2] as string);
      continue;
    }
    if (NO_TESTS.test(line)) {
      const f = currentFile();
      if (f !== undefined) f.noTests = true;
      continue;
    }
    const r = RESULT.exec(line);
    if (r === null) continue;
    const indent = (r[1] as string).length;
    const ok = r[2] === undefined;
    const name = r[3] as string;
    const directive = r[4]?.toUpperCase();
    // Subtests deeper than this result never reported (their process died): the file's end says why.
    while (stack.length > 0 && (stack[stack.length - 1] as Open).indent > indent) stack.pop();
    const top = stack[stack.length - 1];
    const { fields, end } = yamlAfter(lines, i, indent);
    if (indent === 0 && !ok && name === 'timeout!' && fields.has('expired')) {
      // tap's own timeout line names the file it expired; that file is failed below.
      fileOf(fields.get('expired') as string).expired = true;
      i = end;
      continue;
    }
    if (top !== undefined && top.indent === indent && (name === top.name || name.startsWith(`${top.name} `))) {
      stack.pop();
      if (indent === 0) {
        const f = fileOf(top.name);
        f.reported = true;
        f.exitCode = fields.has('exitCode') ? Number(nullable(fields.get('exitCode')) ?? 0) : null;
        f.signal = nullable(fields.get('signal'));
        if (directive === 'SKIP' && /no tests found/i.test(r[5] ?? '')) f.noTests = true;
      } else if (!ok && directive !== 'TODO' && top.failingLeaves === 0) {
        // A subtest that failed without a failing assertion (plan mismatch, thrown in its body).
        failed++;
        for (const o of stack) o.failingLeaves++;
        const f = currentFile();
        if (f !== undefined) f.failures++;
      }
      i = end;
      continue;
    }
    // A leaf assertion.
    if (directive === 'SKIP' || directive === 'TODO') skipped++;
    else if (ok) passed++;
    else {
      failed++;
      for (const o of stack) o.failingLeaves++;
      const f = currentFile();
      if (f !== undefined) f.failures++;
    }
    i = end;
  }

  const problems: FileProblem[] = [];
  for (const [file, f] of files) {
    let reason: string | undefined;
    if (f.expired || f.signal === 'SIGALRM') reason = 'timed out';
    else if (f.signal !== null) reason = `killed by ${f.signal}`;
    else if (f.noTests) reason = 'registers no tests';
    else if (!f.reported) reason = 'reported no result';
    else if (f.exitCode !== null && f.exitCode !== 0) reason = `exited with code ${f.exitCode}`;
    if (reason !== undefined) {
      failed++;
      problems.push({ file, reason: f.failures > 0 ? `${reason}, ${f.failures} failed assertion(s)` : reason });
    } else if (f.failures > 0) {
      problems.push({ file, reason: `${f.failures} failed assertion(s)` });
    }
  }
  return { passed, failed, skipped, problems };
}
