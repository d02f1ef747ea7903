"""a model's measured memory envelope per device: the largest batch of each shape a worker claims, and the videos
submit refuses (engine.models.envelope, jobs.db.envelopes); and each worker session's measured cold start

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07
"""
import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'envelopes',
        sa.Column('model', sa.String(length=128), nullable=False),
        sa.Column('device', sa.String(length=255), nullable=False),
        sa.Column('memory_bytes', sa.BigInteger(), nullable=False),
        sa.Column('resident_bytes', sa.BigInteger(), nullable=False),
        sa.Column('fixed_bytes', sa.Float(), nullable=False),
        sa.Column('per_token_bytes', sa.Float(), nullable=False),
        sa.Column('per_pixel_bytes', sa.Float(), nullable=False),
        sa.Column('spare', sa.Float(), nullable=False),
        sa.Column('ooms', sa.Integer(), server_default='0', nullable=False),
        sa.Column('last_oom', sa.Text(), nullable=True),
        sa.Column('points', sa.Text(), nullable=False),
        sa.Column('measured_with', sa.Text(), nullable=False),
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_envelopes')),
        sa.UniqueConstraint('model', 'device', name=op.f('uq_envelopes_model_device')),
    )
    op.add_column('worker_sessions', sa.Column('cold_start_s', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('worker_sessions') as batch:
        batch.drop_column('cold_start_s')
    op.drop_table('envelopes')
