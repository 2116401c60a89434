// prom-client's Registry, Counter and Gauge, each required from its own module, not through the
// package entry: the entry also loads the histogram and summary (with tdigest), the default
// process metrics (which bring the OpenTelemetry API), the push gateway and the cluster
// aggregator, none of which a worker uses (its histograms are series.ts's own). 0.56 MiB of heap
// and 29 of prom-client's modules less in every worker, besides the OpenTelemetry API's 44
// (docs/performance.md "jose on first use, prom-client's core alone"). They are the same classes
// the entry exports: the supervisor's AggregatorRegistry (full entry) merges what these
// registries render.
import { createRequire } from 'node:module';
import type * as PromClient from 'prom-client';

const require = createRequire(import.meta.url);

export const Registry = require('prom-client/lib/registry') as typeof PromClient.Registry;
export type Registry = PromClient.Registry;
export const Counter = require('prom-client/lib/counter') as typeof PromClient.Counter;
export type Counter<T extends string = string> = PromClient.Counter<T>;
export const Gauge = require('prom-client/lib/gauge') as typeof PromClient.Gauge;
export type Gauge<T extends string = string> = PromClient.Gauge<T>;
