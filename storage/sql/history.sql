-- prompt_history(run, ep, k): every response of the last k epochs before ep that saw each prompt,
-- with its reward: the history HistoSpec's drafter indexes while epoch `ep` runs. A prompt skipped
-- by some epochs still gets its most recent k epochs (the window counts epochs that saw it).
CREATE OR REPLACE MACRO prompt_history(run, ep, k) AS TABLE
WITH seen AS (
    SELECT prompt_id, epoch,
           dense_rank() OVER (PARTITION BY prompt_id ORDER BY epoch DESC) AS back
    FROM (SELECT DISTINCT prompt_id, epoch FROM rollouts WHERE run_id = run AND epoch < ep)
)
SELECT r.prompt_id, r.epoch, r.sample_idx, r.response_token_ids, r.reward
FROM rollouts AS r
JOIN seen AS s ON r.prompt_id = s.prompt_id AND r.epoch = s.epoch
WHERE r.run_id = run AND s.back <= k
ORDER BY r.prompt_id, r.epoch, r.sample_idx;
