-- Response-length analysis over committed rollouts. A response's length is the `length` column,
-- or the number of its token ids for rows written without it.

-- length_by_epoch: the length distribution of each (run, epoch): count, mean, spread, quantiles,
-- and the fraction cut off at max_tokens (finish_reason = 'length').
CREATE OR REPLACE VIEW length_by_epoch AS
SELECT
    run_id,
    epoch,
    count(*) AS responses,
    avg(n) AS mean,
    stddev_pop(n) AS std,
    min(n) AS min,
    quantile_cont(n, 0.10) AS p10,
    quantile_cont(n, 0.50) AS p50,
    quantile_cont(n, 0.90) AS p90,
    quantile_cont(n, 0.99) AS p99,
    max(n) AS max,
    avg(CASE WHEN finish_reason = 'length' THEN 1.0 ELSE 0.0 END) AS truncated_frac
FROM (SELECT run_id, epoch, finish_reason, coalesce(length, len(response_token_ids)) AS n FROM rollouts)
GROUP BY run_id, epoch;

-- length_histogram(bin_width): responses per length bin [bin_start, bin_start + bin_width).
CREATE OR REPLACE MACRO length_histogram(bin_width) AS TABLE
SELECT run_id, epoch, (n // bin_width) * bin_width AS bin_start, count(*) AS responses
FROM (SELECT run_id, epoch, coalesce(length, len(response_token_ids)) AS n FROM rollouts)
WHERE n IS NOT NULL
GROUP BY ALL;

-- length_forecast(run, ep): what epoch `ep` can expect of each prompt from epoch ep - 1 of the
-- same run: responses, mean and max length per prompt (HistoPipe's length forecast input).
CREATE OR REPLACE MACRO length_forecast(run, ep) AS TABLE
SELECT prompt_id, count(*) AS responses,
       avg(coalesce(length, len(response_token_ids))) AS mean_length,
       max(coalesce(length, len(response_token_ids))) AS max_length
FROM rollouts
WHERE run_id = run AND epoch = ep - 1
GROUP BY prompt_id;

-- previous_responses(run, ep): the token ids of every response of epoch ep - 1 of the same run,
-- the history HistoSpec's drafter indexes while epoch `ep` runs.
CREATE OR REPLACE MACRO previous_responses(run, ep) AS TABLE
SELECT prompt_id, sample_idx, response_token_ids
FROM rollouts
WHERE run_id = run AND epoch = ep - 1;
