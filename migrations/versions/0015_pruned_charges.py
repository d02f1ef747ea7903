"""a pruned run's cost records summed per worker session, so the ledger reads the same after `reelbatch prune`
(jobs.db.prune)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'pruned_charges',
        sa.Column('session_id', sa.Integer(), nullable=False),
        sa.Column('run_id', sa.Integer(), nullable=False),
        sa.Column('run_name', sa.String(length=128), nullable=False),
        sa.Column('seconds', sa.Float(), nullable=False),
        sa.Column('amount_micro_usd', sa.BigInteger(), nullable=False),
        sa.Column('succeeded_videos', sa.Integer(), nullable=False),
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['session_id'], ['worker_sessions.id'],
                                name=op.f('fk_pruned_charges_session_id_worker_sessions'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_pruned_charges')),
    )
    op.create_index(op.f('ix_pruned_charges_session_id'), 'pruned_charges', ['session_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_pruned_charges_session_id'), table_name='pruned_charges')
    op.drop_table('pruned_charges')
