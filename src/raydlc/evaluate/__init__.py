"""What a run produced, looked at: the export found and loaded (`exports`), text generated with its chat template
(`generation`), the held-out perplexity and lm-evaluation-harness tasks (`scoring`, `harness`), and the model card
(`card`); `ending` plugs the evaluation and the card into the run's end (train.ending). Used by `raydlc generate`,
`raydlc eval` and, with EVAL_AFTER, by a Ray task after training. Below train: a built-in spec's seeded base is
built by a function the caller hands in."""
