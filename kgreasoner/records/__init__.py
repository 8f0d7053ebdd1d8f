"""Records and their readers, the bottom layer: the QA example schema and its JSONL, trajectories, splits and
sampling, answer normalisation, the published formats' readers, the id vocabulary of every graph (`ids`) and the
HTTP client every remote endpoint shares (`http`). Its modules import only each other, and
this file imports nothing."""
