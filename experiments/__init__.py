"""Studies, paper reproductions and reports built on `deq_jax` and `launch`: one
subfolder per study, each with a README naming its commands and where its results are."""
