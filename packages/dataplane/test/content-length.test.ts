// Content-Length canonical form (RFC 9110 §8.6, RFC 9112 §6.3), table-driven: what is forwarded
// for each spelling, and which are refused (null).
import t from 'tap';
import { canonicalContentLength } from '../src/policy/content-length.ts';

const cases: [string | string[] | undefined, string | null | undefined][] = [
  [undefined, undefined],
  ['0', '0'],
  ['5', '5'],
  ['1234567890', '1234567890'],
  ['005', '5'],
  ['000', '0'],
  ['0005000', '5000'],
  ['5, 5', '5'],
  ['5,05', '5'],
  [' 5 ', '5'],
  [['5', '5'], '5'],
  [['005', '5, 5'], '5'],
  ['5, 6', null],
  [['5', '6'], null],
  ['', null],
  [',', null],
  ['5,', null],
  ['+5', null],
  ['-1', null],
  ['0x5', null],
  ['5.0', null],
  ['5e3', null],
  ['٥', null],
  ['1 2', null],
  ['999999999999999', '999999999999999'],
  ['1000000000000000', null],
  ['0001000000000000', '1000000000000'],
];

t.test('canonicalContentLength', async (t) => {
  for (const [value, expected] of cases) t.equal(canonicalContentLength(value), expected, JSON.stringify(value));
});
