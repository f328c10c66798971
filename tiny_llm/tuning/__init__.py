"""The staged throughput tuner: profiles and their candidate plan (torch-free), and the tuner loop that runs
each candidate as a benchmark-worker process and selects the fastest."""
