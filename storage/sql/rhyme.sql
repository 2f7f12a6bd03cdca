-- The "rhyme" between epochs: how much of a response is reusable from the previous epoch's
-- responses to the same prompt in the same run.
--
-- A token of a response in epoch e is COVERED when it lies inside a span of at least k tokens
-- that also occurs in some response of epoch e - 1 to the same prompt. A span of length >= k
-- matches exactly when all its k-grams match, so a token is covered iff some k-gram of the
-- response that contains it is among the previous epoch's k-grams: the SQL joins k-grams.
-- k-grams are compared as exact lists (no hashing, so no collisions). Responses shorter than k
-- have nothing covered; epoch 0, and prompts absent from epoch e - 1, have no row.
--
-- rhyme_by_response(k): one row per response of epoch e with a previous epoch.
CREATE OR REPLACE MACRO rhyme_by_response(k) AS TABLE
WITH cur AS (
    SELECT r.run_id, r.prompt_id, r.epoch, r.sample_idx, r.response_token_ids AS toks
    FROM rollouts r
    SEMI JOIN (SELECT DISTINCT run_id, prompt_id, epoch + 1 AS epoch FROM rollouts) p
        USING (run_id, prompt_id, epoch)
),
prev_grams AS (
    SELECT DISTINCT run_id, prompt_id, epoch + 1 AS epoch, toks[j : j + k - 1] AS gram
    FROM (SELECT run_id, prompt_id, epoch, response_token_ids AS toks,
                 unnest(range(1, len(response_token_ids) - k + 2)) AS j
          FROM rollouts)
),
cur_grams AS (
    SELECT run_id, prompt_id, epoch, sample_idx, j, toks[j : j + k - 1] AS gram
    FROM (SELECT *, unnest(range(1, len(toks) - k + 2)) AS j FROM cur)
),
covered AS (
    SELECT run_id, prompt_id, epoch, sample_idx, count(DISTINCT pos) AS covered_tokens
    FROM (
        SELECT g.run_id, g.prompt_id, g.epoch, g.sample_idx, unnest(range(g.j, g.j + k)) AS pos
        FROM cur_grams g SEMI JOIN prev_grams p USING (run_id, prompt_id, epoch, gram)
    )
    GROUP BY ALL
)
SELECT c.run_id, c.prompt_id, c.epoch - 1 AS prev_epoch, c.epoch, c.sample_idx,
       len(c.toks) AS tokens,
       coalesce(v.covered_tokens, 0) AS covered_tokens,
       coalesce(v.covered_tokens, 0) / nullif(len(c.toks), 0) AS rhyme
FROM cur c LEFT JOIN covered v USING (run_id, prompt_id, epoch, sample_idx);

-- rhyme_by_prompt(k): per prompt and epoch pair; `rhyme` weights responses by their tokens,
-- `mean_response_rhyme` weights them equally.
CREATE OR REPLACE MACRO rhyme_by_prompt(k) AS TABLE
SELECT run_id, prompt_id, prev_epoch, epoch, count(*) AS responses, sum(tokens)::BIGINT AS tokens,
       sum(covered_tokens)::BIGINT AS covered_tokens,
       sum(covered_tokens) / nullif(sum(tokens), 0) AS rhyme,
       avg(rhyme) AS mean_response_rhyme
FROM rhyme_by_response(k)
GROUP BY run_id, prompt_id, prev_epoch, epoch;

-- rhyme_by_epoch(k): per epoch pair of a run, over all its prompts.
CREATE OR REPLACE MACRO rhyme_by_epoch(k) AS TABLE
SELECT run_id, prev_epoch, epoch, count(DISTINCT prompt_id) AS prompts, count(*) AS responses,
       sum(tokens)::BIGINT AS tokens, sum(covered_tokens)::BIGINT AS covered_tokens,
       sum(covered_tokens) / nullif(sum(tokens), 0) AS rhyme,
       avg(rhyme) AS mean_response_rhyme
FROM rhyme_by_response(k)
GROUP BY run_id, prev_epoch, epoch;

-- The paper's measure: matches of length >= 4.
CREATE OR REPLACE VIEW rhyme AS SELECT * FROM rhyme_by_prompt(4);
CREATE OR REPLACE VIEW rhyme_epochs AS SELECT * FROM rhyme_by_epoch(4);
