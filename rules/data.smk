# Data stage: embedded corpus -> tokenizer -> token cache ("C4 caching").
# For the real C4 the same prepare_cache rule streams allenai/c4 with a hub tokenizer (config/cluster.yaml).
# One cache serves every size: its recipe (results/data/prepare.yaml) asks for the largest budget of any job.


rule build_corpus:
    output:
        directory(CORPUS_DIR),
    log:
        "logs/build_corpus/corpus.log",
    benchmark:
        "logs/build_corpus/corpus.tsv"
    conda:
        "../envs/torch.yaml"
    params:
        validation_fraction=config["data"]["validation_fraction"],
    shell:
        "python -m tiny_llm build-demo-corpus --output {output:q} "
        "--validation-fraction {params.validation_fraction:q} > {log:q} 2>&1"


rule train_tokenizer:
    input:
        corpus=PLAN.book.corpus_dataset(),
    output:
        directory(TOKENIZER_DIR),
    log:
        "logs/train_tokenizer/tokenizer.log",
    benchmark:
        "logs/train_tokenizer/tokenizer.tsv"
    conda:
        "../envs/torch.yaml"
    params:
        vocab_size=PLAN.data.tokenizer_vocab_size(),
    shell:
        "python -m tiny_llm train-tokenizer --input {input.corpus:q} --vocab-size {params.vocab_size:q} "
        "--output {output:q} > {log:q} 2>&1"


rule prepare_cache:
    input:
        unpack(prepare_inputs),
    output:
        # its manifest, written last by the cache's own atomic publish: update() keeps Snakemake from
        # deleting it before a rerun, which then validates and reuses the cache (or refuses a foreign one)
        update(PLAN.data.cache_manifest),
    log:
        "logs/prepare_cache/cache.log",
    benchmark:
        "logs/prepare_cache/cache.tsv"
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("data")
    resources:
        **PLAN.resources("data"),
    params:
        plan=plan_file_digests,
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "python -m tiny_llm prepare --config {input.recipe:q} > {log:q} 2>&1"
