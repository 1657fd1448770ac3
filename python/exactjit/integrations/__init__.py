"""Drop-in integrations of exactjit into model libraries, one module per library, each imported on
its own (`from exactjit.integrations import diffusers`) so that importing exactjit never imports
them or the libraries they patch."""
