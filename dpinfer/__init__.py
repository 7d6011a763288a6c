"""dpinfer: differentially private releases as transparent likelihoods for PyMC."""
