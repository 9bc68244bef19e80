"""The generic resource registry: one store and one route installer for every kind it keeps.

As the Kubernetes apiserver's generic registry: a kind brings only its *strategy*
(`strategy.Strategy`: schema, scope, how it is prepared and validated on create and update, its
status subresource, table columns, field selectors, what deleting it does); `store.Store` gives
every kind the same verbs with the same semantics (get, list paged in SQL, watch, create, update,
patch in the four formats, delete, deletecollection, dryRun, fieldValidation, preconditions,
finalizers and deletionTimestamp, the change log), and `installer.install` serves them over HTTP.
Objects live in one table (`objects`), so a new kind needs no migration of its own (what a kind
keeps beside its objects, as a Callback's secret, is in tables keyed by the object's uid).

    app/registry/strategy.py   what a kind declares
    app/registry/store.py      the verbs, in SQL, in the caller's transaction
    app/registry/installer.py  the routes of every verb, for any strategy
    app/registry/kinds/        the kinds kept here (ConfigMap, Secret, workloads, Callback, PodGroup)
"""
