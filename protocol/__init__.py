"""The SAPO wire protocol (torch-free): identity, signed envelopes, validation, transports."""
