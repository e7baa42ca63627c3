"""Fine-tuning data prepared once: documents to packed fixed-length blocks, written as shards
plus a manifest, and read back by index.

`formats` (pure) turns one record of any supported format into segments that do or do not carry
the loss; `sources` lists and reads the files of a source (local, s3://) and fingerprints them;
`corpus` is the bundled corpus (the default source); `tokenizer` trains or loads the tokenizer and
`encode` turns records into token ids with it; `pipeline` runs reading and tokenizing as a Ray Data
pipeline and packs its ordered output into shards; `manifest` is the dataset's description and its
checks; `shards` writes, verifies and reads the blocks; `order` says which rows are train and which
are eval, and which each rank reads at each step, by index alone; `dataset` decides and makes a
run's dataset. Nothing here imports raydlc.train: training reads its data from here.
"""
