"""decode.py's job, a file translated or scored by an `Engine`: the job and its checks
(jobs.py), its input blocks and progress (job_io.py), and its output file with --resume's
partial and record (outputs.py)."""
