-- Length-rank stability between consecutive epochs of a run: do prompts that gave long
-- responses last epoch give long responses again? (What length forecasts rely on.)
--
-- Each prompt's length in an epoch is the mean length of its responses there. For the pair
-- (e - 1, e), only prompts present in both epochs are ranked. Ranks are 1-based average ranks
-- (ties share the mean of their positions), and a prompt's percentile is
-- 100 * (rank - 1) / (prompts - 1), so the shortest is 0 and the longest 100.
--
-- length_rank_moves(threshold_pct): one row per prompt and epoch pair; `moved` is true when
-- the prompt's percentile changed by more than threshold_pct.
CREATE OR REPLACE MACRO length_rank_moves(threshold_pct) AS TABLE
WITH per_prompt AS (
    SELECT run_id, epoch, prompt_id, avg(coalesce(length, len(response_token_ids))) AS mean_length
    FROM rollouts
    GROUP BY run_id, epoch, prompt_id
),
pairs AS (
    SELECT c.run_id, p.epoch AS prev_epoch, c.epoch, c.prompt_id,
           p.mean_length AS prev_length, c.mean_length AS length
    FROM per_prompt c
    JOIN per_prompt p ON p.run_id = c.run_id AND p.prompt_id = c.prompt_id AND p.epoch = c.epoch - 1
    WHERE p.mean_length IS NOT NULL AND c.mean_length IS NOT NULL
),
ranked AS (
    SELECT *,
        rank() OVER (PARTITION BY run_id, epoch ORDER BY prev_length)
            + (count(*) OVER (PARTITION BY run_id, epoch, prev_length) - 1) / 2.0 AS prev_rank,
        rank() OVER (PARTITION BY run_id, epoch ORDER BY length)
            + (count(*) OVER (PARTITION BY run_id, epoch, length) - 1) / 2.0 AS rank,
        count(*) OVER (PARTITION BY run_id, epoch) AS prompts
    FROM pairs
)
SELECT run_id, prompt_id, prev_epoch, epoch, prev_length, length, prev_rank, rank,
       100.0 * (prev_rank - 1) / nullif(prompts - 1, 0) AS prev_pct,
       100.0 * (rank - 1) / nullif(prompts - 1, 0) AS pct,
       abs(100.0 * (rank - prev_rank) / nullif(prompts - 1, 0)) > threshold_pct AS moved
FROM ranked;

-- length_rank_stability_at(threshold_pct): per epoch pair, Spearman's rank correlation of the
-- prompts' lengths (Pearson correlation of the average ranks, as scipy.stats.spearmanr) and
-- the fraction of prompts whose percentile moved by more than threshold_pct.
CREATE OR REPLACE MACRO length_rank_stability_at(threshold_pct) AS TABLE
SELECT run_id, prev_epoch, epoch, count(*) AS prompts,
       -- undefined (NULL, not NaN) when either epoch's lengths are all tied
       CASE WHEN var_pop(prev_rank) > 0 AND var_pop(rank) > 0 THEN corr(prev_rank, rank) END AS spearman,
       avg(moved::DOUBLE) AS moved_frac
FROM length_rank_moves(threshold_pct)
GROUP BY run_id, prev_epoch, epoch;

CREATE OR REPLACE VIEW length_rank_stability AS SELECT * FROM length_rank_stability_at(25);
